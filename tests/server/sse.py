"""A small Server-Sent Events reader for the tests (what a browser's
EventSource does, minus the automatic reconnect, which the tests drive)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class Event:
    id: str | None
    event: str
    data: Any
    #: a comment line (a heartbeat), not an event
    comment: bool = False


def events(response: httpx.Response) -> Iterator[Event]:
    """The events of a streamed response, comments (heartbeats) included, as they arrive."""
    fields: dict[str, str] = {}
    data: list[str] = []
    for line in response.iter_lines():
        if line == "":
            if data:  # as in a browser, a block without data (``retry:``) dispatches nothing
                yield Event(fields.get("id"), fields.get("event", "message"),
                            json.loads("\n".join(data)) if data else None)
            fields, data = {}, []
            continue
        if line.startswith(":"):
            yield Event(None, "comment", line[1:].strip(), comment=True)
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        else:
            fields[name] = value
