"""Benchmark harness: Cairn measured side by side with LangGraph, DBOS and bare SQLite."""
