"""An offline research agent: the workload ``cairn demo`` kills and resumes.

It answers a question about a small corpus of incident reports shipped with
the package. A scripted model (``ScriptedModel``) stands in for an LLM so the
demo needs no network and no API key, yet the run has the shape of a real
agent: a planning call, tool calls that read files, model calls that extract
findings, a durable timer (a rate-limit back-off), a summary, a review and a
tool call that writes the report.

Every tool and model step first appends one line to an *effects log*: the
stand-in for the outside world (an API bill, a charged card, a sent email).
The journal says what Cairn recorded; the effects log says what actually
happened. Comparing the two is how the demo proves that no finished step ran
twice after a worker was killed.

Steps sleep 150-300 ms so that a kill lands in the middle of the run rather
than after it, the way real model and tool calls take their time.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import cairn

#: Built without arguments so the database comes from ``$CAIRN_DB``, which the
#: CLI sets from ``--db`` before importing this module.
app = cairn.App()

WORKFLOW = "research-agent"
QUESTION = "What caused the March checkout incidents, and which fix should land first?"

#: Journal positions that do not depend on the budget: uuid, now, search, plan,
#: sleep, summarize, review, write_report. Each file read adds two more
#: (read_file and extract).
FIXED_STEPS = 8
#: How long the durable timer waits before the summarizing call. Long enough
#: to see the run suspend (holding no worker), short enough for a demo.
RATE_LIMIT_PAUSE = 1.0
#: Simulated latency of each step body, in seconds.
STEP_SECONDS = {
    "search": 0.18,
    "plan": 0.28,
    "read_file": 0.16,
    "extract": 0.24,
    "summarize": 0.30,
    "review": 0.26,
    "write_report": 0.16,
}

Message = dict[str, Any]


@dataclass(frozen=True)
class SearchHit:
    path: str
    hits: int
    keywords: list[str]


@dataclass(frozen=True)
class Finding:
    kind: str  # "cause", "impact", "action" or "context"
    text: str
    source: str


# -- the corpus and the outside world ------------------------------------------------------


def corpus() -> Traversable:
    """The shipped text files; read through importlib.resources so the demo
    works from a wheel or a zip as well as from a source checkout."""
    return resources.files("cairn.demo").joinpath("files")


def corpus_names() -> list[str]:
    return sorted(entry.name for entry in corpus().iterdir() if entry.name.endswith(".txt"))


def _sqlite_file(url: str | None) -> Path | None:
    """The file behind a database URL as ``cairn.store.open_store`` reads it;
    ``None`` for non-file stores such as ``memory://``."""
    if not url or url.startswith("memory://"):
        return None
    if url.startswith("sqlite://"):
        return Path(url.removeprefix("sqlite://")[1:])
    return None if "://" in url else Path(url)


def _beside_db(suffix: str) -> Path:
    db = _sqlite_file(app.db_url)
    if db is None:
        return Path(".cairn") / f"demo{suffix}"
    return db.with_name(db.stem + suffix)


def effects_path() -> Path:
    """Where effects are logged: ``$CAIRN_DEMO_EFFECTS``, else next to the database."""
    configured = os.environ.get("CAIRN_DEMO_EFFECTS")
    return Path(configured) if configured else _beside_db(".effects.jsonl")


def default_out_dir() -> Path:
    """Where reports go when the run's input names no directory."""
    configured = os.environ.get("CAIRN_DEMO_OUT")
    return Path(configured) if configured else _beside_db("-reports")


def record_effect(step: str) -> None:
    """Append one line to the effects log, at the moment the step acts.

    Written at the *start* of the body on purpose: a step killed half-way
    has already touched the world, and it is the one step that runs again on
    the next worker. One ``O_APPEND`` write per line keeps lines whole even
    with several processes appending, and the kernel keeps the line if this
    process is SIGKILLed right after.
    """
    info = cairn.step_info()
    line = {
        "run_id": info.run_id,
        "position": info.position,
        "step": step,
        "attempt": info.attempt,
        "pid": os.getpid(),
        "operation_id": info.operation_id,
        "at": time.time(),
    }
    path = effects_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


def read_effects(path: Path, run_id: str) -> list[dict[str, Any]]:
    """The effects logged for ``run_id`` (other runs may share the file)."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    effects = [json.loads(line) for line in lines if line.strip()]
    return [e for e in effects if e.get("run_id") == run_id]


def _act(step: str) -> None:
    record_effect(step)
    time.sleep(STEP_SECONDS[step])


# -- the scripted model ---------------------------------------------------------------------

_STOPWORDS = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "by", "did", "do", "does", "first", "for", "from", "how",
    "in", "is", "it", "land", "of", "on", "or", "should", "the", "to", "was", "what", "when", "which",
    "who", "why", "with",
})
_THEMES: dict[str, tuple[str, ...]] = {
    "idempotency keys on side effects": ("idempoten", "charged twice", "duplicate charge"),
    "persist progress between steps": ("persist", "restart", "resume", "starting over", "first step"),
    "a single retry budget with backoff": ("retry", "retries", "backoff"),
    "bounded caches": ("cache",),
    "connection pool hygiene": ("connection pool", "pool"),
    "alerts people trust": ("alert", "muted"),
}
_URGENT = ("launch blocker", "charged twice")
_CAUSE = re.compile(r"root cause|caused|because|failure mode|contributing", re.IGNORECASE)
_IMPACT = re.compile(r"\d[\d,.]*\s*(?:%|customers|orders|tickets|lost orders|EUR)", re.IGNORECASE)
_ACTION = re.compile(r"^(?:fix|add)\b|launch blocker|must\b", re.IGNORECASE)


def keywords(question: str) -> list[str]:
    words = re.findall(r"[a-z0-9]+", question.lower())
    return [w for w in dict.fromkeys(words) if w not in _STOPWORDS and len(w) > 2]


def search_corpus(question: str) -> list[SearchHit]:
    """Keyword search over the corpus, best match first (the search tool's logic)."""
    terms = keywords(question)
    hits = []
    for name in corpus_names():
        text = corpus().joinpath(name).read_text(encoding="utf-8").lower()
        found = [t for t in terms if t in text]
        hits.append(SearchHit(name, sum(text.count(t) for t in terms), found))
    return sorted(hits, key=lambda h: (-h.hits, h.path))


def reads_for_budget(budget: int, available: int) -> int:
    """How many files fit in a budget of journal steps (two steps per file)."""
    return max(0, min(available, (budget - FIXED_STEPS) // 2))


def expected_steps(question: str, budget: int) -> int:
    """Journal length of a run: lets ``cairn demo`` size its progress bar and
    decide when 40% of the work is done before the run has planned anything."""
    relevant = sum(1 for hit in search_corpus(question) if hit.hits)
    return FIXED_STEPS + 2 * reads_for_budget(budget, relevant)


class ScriptedModel:
    """A deterministic stand-in for an LLM.

    Like a chat model it reads the conversation so far and answers with the
    next message: a tool-call decision, extracted findings or prose. Being
    deterministic is *not* what makes replay safe (a real model is not);
    the journal is. It only makes the demo's output reproducible.
    """

    def plan(self, conversation: list[Message]) -> Message:
        """Decide which files to read, from the search results and the budget
        stated in the system message."""
        budget = int(conversation[0]["max_steps"])
        results = next(m for m in reversed(conversation) if m["role"] == "tool" and m["name"] == "search")
        relevant = [hit for hit in results["content"] if hit["hits"] > 0]
        chosen = relevant[: reads_for_budget(budget, len(relevant))]
        calls = [{"tool": "read_file", "path": hit["path"]} for hit in chosen]
        skipped = len(relevant) - len(chosen)
        thought = f"{len(relevant)} files mention the question's terms; reading the {len(chosen)} best"
        if skipped:
            thought += f" (the step budget of {budget} leaves out {skipped})"
        return {"role": "assistant", "content": thought, "tool_calls": calls}

    def extract(self, question: str, source: str, text: str) -> list[Finding]:
        """Pull causes, impact and actions out of one document."""
        findings: list[Finding] = []
        for sentence in _sentences(text):
            if _ACTION.search(sentence):
                kind = "action"
            elif _CAUSE.search(sentence):
                kind = "cause"
            elif _IMPACT.search(sentence):
                kind = "impact"
            else:
                continue
            findings.append(Finding(kind, sentence, source))
        return findings[:8]

    def summarize(self, question: str, findings: list[Finding], generated: str, report_id: str) -> str:
        """Write the report: themes ranked by how many documents support them,
        then by how many findings call them urgent (a launch blocker, customers
        charged twice)."""
        support = _theme_support(findings)

        def urgency(theme: str) -> int:
            needles = _THEMES[theme]
            return sum(1 for f in findings if _mentions(f.text, needles) and _mentions(f.text, _URGENT))

        ranked = sorted(support, key=lambda theme: (-len(support[theme]), -urgency(theme), theme))
        lines = [
            f"# Research report {report_id}",
            "",
            f"**Question:** {question}",
            f"**Generated:** {generated} by the Cairn demo agent (scripted model, offline)",
            "",
            "## Root causes",
        ]
        lines += [f"- {f.text} [{f.source}]" for f in findings if f.kind == "cause"]
        lines += ["", "## Impact"]
        lines += [f"- {f.text} [{f.source}]" for f in findings if f.kind == "impact"]
        lines += ["", "## Recurring themes", "", "| theme | documents |", "| --- | --- |"]
        lines += [f"| {theme} | {len(support[theme])} |" for theme in ranked if support[theme]]
        lines += ["", "## Which fix should land first"]
        if ranked and support[ranked[0]]:
            top = ranked[0]
            lines.append(
                f"Start with **{top}**: {len(support[top])} documents point to it "
                f"({', '.join(sorted(support[top]))})."
            )
            related = [f for f in findings if f.kind == "action" and _mentions(f.text, _THEMES[top])]
            lines += [f"- {f.text} [{f.source}]" for f in related]
        lines += ["", "## Sources", *[f"- {s}" for s in sorted({f.source for f in findings})]]
        return "\n".join(lines) + "\n"

    def review(self, draft: str, findings: list[Finding]) -> str:
        """Check every claim cites a source; append the reviewer's notes."""
        claims = [line for line in draft.splitlines() if line.startswith("- ") and "[" in line]
        uncited = [line for line in draft.splitlines() if line.startswith("- ") and "[" not in line
                   and not line.endswith(".txt")]
        support = _theme_support(findings)
        thin = sorted(theme for theme, docs in support.items() if len(docs) == 1)
        notes = ["", "## Review", f"- {len(claims)} claims checked; {len(uncited)} without a source."]
        if thin:
            notes.append(f"- Supported by a single document only: {', '.join(thin)}.")
        return draft + "\n".join(notes) + "\n"


def _sentences(text: str) -> list[str]:
    """Paragraphs and bullets re-joined across line wraps, then split into sentences."""
    blocks: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            blocks.append("")
        elif line.startswith(("-", "1.", "2.", "3.")) or not blocks or not blocks[-1]:
            blocks.append(line.lstrip("-0123456789. ").strip())
        else:
            blocks[-1] += " " + line
    out: list[str] = []
    for block in blocks:
        out += [s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", block) if len(s.strip()) > 20]
    return out


def _mentions(text: str, needles: tuple[str, ...]) -> bool:
    lowered = text.lower()
    return any(needle in lowered for needle in needles)


def _theme_support(findings: list[Finding]) -> dict[str, set[str]]:
    return {theme: {f.source for f in findings if _mentions(f.text, needles)}
            for theme, needles in _THEMES.items()}


MODEL = ScriptedModel()


# -- steps ------------------------------------------------------------------------------------


@app.step(name="search")
def search(question: str) -> list[SearchHit]:
    """Tool: keyword search over the corpus."""
    _act("search")
    return search_corpus(question)


@app.step(name="plan")
def plan(conversation: list[Message]) -> Message:
    """Model call: choose the tool calls to make."""
    _act("plan")
    return MODEL.plan(conversation)


@app.step(name="read_file")
def read_file(path: str) -> str:
    """Tool: read one corpus file. Only names listed in the corpus are served,
    so a model cannot talk the tool into reading arbitrary paths."""
    _act("read_file")
    if path not in corpus_names():
        raise cairn.TerminalError(f"no such file in the corpus: {path!r}")
    return corpus().joinpath(path).read_text(encoding="utf-8")


@app.step(name="extract")
def extract(question: str, source: str, text: str) -> list[Finding]:
    """Model call: findings relevant to the question in one document."""
    _act("extract")
    return MODEL.extract(question, source, text)


@app.step(name="summarize")
def summarize(question: str, findings: list[Finding], generated: str, report_id: str) -> str:
    """Model call: draft the report."""
    _act("summarize")
    return MODEL.summarize(question, findings, generated, report_id)


@app.step(name="review")
def review(draft: str, findings: list[Finding]) -> str:
    """Model call: check the draft's citations."""
    _act("review")
    return MODEL.review(draft, findings)


@app.step(name="write_report")
def write_report(out_dir: str, filename: str, markdown: str) -> str:
    """Tool: write the report file; returns its absolute path.

    Idempotent by construction (the file name comes from a journaled uuid and
    the write replaces the file atomically), so even the one re-execution a
    crash can cause leaves exactly one complete report.
    """
    _act("write_report")
    directory = Path(out_dir).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / filename
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".md")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(markdown)
    os.replace(tmp, target)
    return str(target)


# -- the workflow -----------------------------------------------------------------------------


@app.workflow(name=WORKFLOW, version="1")
def research_agent(
    ctx: cairn.Context, question: str = QUESTION, max_steps: int = 20, out_dir: str = ""
) -> dict[str, Any]:
    """Research ``question`` over the corpus within ``max_steps`` journal steps
    and write a markdown report into ``out_dir`` (default: next to the database).

    (Not called ``budget``: ``App.start`` takes a ``budget=`` of its own.)
    """
    if max_steps < FIXED_STEPS + 2:
        raise ValueError(f"max_steps must be at least {FIXED_STEPS + 2}")
    report_id = ctx.uuid().hex[:8]
    generated = ctx.now().isoformat(timespec="seconds")
    conversation: list[Message] = [
        {"role": "system", "content": "You research questions over local files.",
         "max_steps": max_steps},
        {"role": "user", "content": question},
    ]
    hits = search(question)
    conversation.append({"role": "tool", "name": "search",
                         "content": [{"path": h.path, "hits": h.hits} for h in hits]})
    decision = plan(conversation)
    conversation.append(decision)
    findings: list[Finding] = []
    for call in decision["tool_calls"]:
        text = read_file(call["path"])
        conversation.append({"role": "tool", "name": "read_file", "content": text})
        found = extract(question, call["path"], text)
        conversation.append({"role": "assistant", "content": f"{len(found)} findings in {call['path']}"})
        findings.extend(found)
    # The model provider rate-limits long calls: back off on a durable timer,
    # which frees the worker instead of sleeping in it.
    ctx.sleep(RATE_LIMIT_PAUSE)
    draft = summarize(question, findings, generated, report_id)
    final = review(draft, findings)
    report = write_report(out_dir or str(default_out_dir()), f"report-{report_id}.md", final)
    return {
        "report": report,
        "report_id": report_id,
        "files_read": [call["path"] for call in decision["tool_calls"]],
        "findings": len(findings),
    }
