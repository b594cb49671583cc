"""Bundles: what decides a run's behaviour, pinned at its start.

A bundle is a workflow's name and version, the hash of its code, and the
prompts, model settings and tools registered with the app. Its id is a
hash of that content (``bundle_id``), so it is stable across processes and
machines: the same code and settings give the same id everywhere, and any
change to one of them gives a new id.

What changes the id:

* the workflow's **code**: the function's syntax tree (``code_hash``), so any
  change to a statement, expression or name in its body or signature;
* its name or version;
* any prompt or model setting registered with the app (``app.prompt``,
  ``app.model_settings``), added, removed or changed;
* any tool registered with the app: its name, effect class, parameters or
  result schema.

What does not: comments, blank lines, formatting, the docstring, the
decorators and the Python name of the workflow function; the bodies of steps and tools (their
outcomes are journaled, so replay never runs them); anything else in the
process. The Python version does not either, as long as the source is
available (without it, the bytecode is hashed, which does depend on it).

A run records its bundle id at start. A worker serves a stored bundle when
it has the same workflow name and version with the same code hash (the
*code* is what must match: prompts and model settings are read from the
stored bundle, never from the process), and refuses one whose code differs
(``Registry.refresh`` logs why, once): silent drift is the failure this
prevents. Several versions of one workflow are served side by side: each run
executes on the code of its own bundle.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import logging
import textwrap
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

import msgspec

from cairn.engine.definitions import WorkflowDef
from cairn.errors import CairnError, StoreError
from cairn.store.contract import Store
from cairn.store.records import BundleRecord, RunRecord

log = logging.getLogger("cairn.bundles")

#: Bumped if what goes into a bundle's content changes shape.
CONTENT_FORMAT = 1


class BundleDamaged(StoreError):
    """A stored bundle is not what its id says (edited or damaged)."""


class BundleNotServed(CairnError):
    """This process has no code for a run's bundle (or refused it: drift)."""

    def __init__(self, run_id: str, bundle: str, why: str) -> None:
        super().__init__(f"run {run_id!r} executes on bundle {bundle}, which this process does not "
                         f"serve: {why}")
        self.run_id = run_id
        self.bundle = bundle


def bundle_id(content: bytes) -> str:
    """The id of a bundle whose canonical content is ``content``: ``b`` and
    the first 24 hex digits of its SHA-256 (96 bits; PostgreSQL's CHECK on
    ``bundles`` computes the same)."""
    return "b" + hashlib.sha256(content).hexdigest()[:24]


def code_hash(fn: Callable[..., Any]) -> str:
    """A hash of ``fn``'s code that ignores what cannot change behaviour:
    its syntax tree without positions, docstring, decorators or the
    function's own name. Without
    source (a function built by ``exec``), its bytecode and constants."""
    target = inspect.unwrap(fn)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(target)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return "bytecode:" + hashlib.sha256(_code_bytes(target.__code__)).hexdigest()[:32]
    node = tree.body[0] if tree.body else tree
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        node.decorator_list = []
        node.name = "_"  # the workflow's name is in the bundle; the function's is not behaviour
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str) and len(body) > 1:
            node.body = body[1:]
    dumped = ast.dump(node, annotate_fields=True, include_attributes=False)
    return "ast:" + hashlib.sha256(dumped.encode()).hexdigest()[:32]


def _code_bytes(code: CodeType) -> bytes:
    parts = [code.co_code, repr(code.co_names).encode(), repr(code.co_varnames).encode()]
    for const in code.co_consts:
        parts.append(_code_bytes(const) if isinstance(const, CodeType) else repr(const).encode())
    return b"\x00".join(parts)


def tool_fingerprint(name: str, effect: str, signature: str, result_type: Any) -> dict[str, Any]:
    """What a bundle holds of a tool: name, effect class, parameters and
    result schema (a JSON Schema where one can be derived, else the type's
    name)."""
    schema: Any
    try:
        model_schema = getattr(result_type, "model_json_schema", None)
        schema = model_schema() if callable(model_schema) else msgspec.json.schema(result_type)
    except Exception:  # not every annotation has a JSON Schema: its name is what we can pin
        schema = getattr(result_type, "__qualname__", repr(result_type))
    return {"name": name, "effect": effect, "parameters": signature, "schema": schema}


_ENCODER = msgspec.json.Encoder(order="sorted")


@dataclass(frozen=True, slots=True)
class Bundle:
    """A bundle's content and id. Build one with ``Bundle.build``; read a
    stored one with ``Bundle.from_record`` (checked against its id)."""

    bundle_id: str
    workflow: str
    version: str
    code: str
    prompts: Mapping[str, str]
    models: Mapping[str, Any]
    tools: tuple[Mapping[str, Any], ...]
    content: bytes = field(repr=False)

    @classmethod
    def build(
        cls, workflow: str, version: str, code: str, prompts: Mapping[str, str],
        models: Mapping[str, Any], tools: Collection[Mapping[str, Any]],
    ) -> Bundle:
        ordered_tools = tuple(sorted(tools, key=lambda t: str(t["name"])))
        body = {"format": CONTENT_FORMAT, "workflow": workflow, "version": version, "code": code,
                "prompts": dict(prompts), "models": dict(models), "tools": list(ordered_tools)}
        content = _ENCODER.encode(body)
        # read back what was stored, so a built bundle and a loaded one are equal
        return cls._parse(bundle_id(content), content)

    @classmethod
    def from_record(cls, record: BundleRecord) -> Bundle:
        """The bundle a stored row holds; ``BundleDamaged`` unless the
        content hashes to the id and names the row's workflow, version and code."""
        if bundle_id(record.content) != record.bundle_id:
            raise BundleDamaged(f"stored bundle {record.bundle_id} does not hash to its id "
                                "(damaged or edited)")
        bundle = cls._parse(record.bundle_id, record.content)
        if (bundle.workflow, bundle.version, bundle.code) != (record.workflow, record.version, record.code):
            raise BundleDamaged(f"stored bundle {record.bundle_id}: its columns do not match its content")
        return bundle

    @classmethod
    def _parse(cls, bid: str, content: bytes) -> Bundle:
        try:
            body = msgspec.json.decode(content)
            return cls(bundle_id=bid, workflow=str(body["workflow"]), version=str(body["version"]),
                       code=str(body["code"]), prompts=dict(body["prompts"]), models=dict(body["models"]),
                       tools=tuple(body["tools"]), content=content)
        except (msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
            raise BundleDamaged(f"stored bundle {bid} cannot be read: {exc}") from None

    def record(self, now: float = 0.0) -> BundleRecord:
        return BundleRecord(self.bundle_id, self.workflow, self.version, self.code, self.content, now)


def version_key(version: str) -> tuple[Any, ...]:
    """Order versions: dotted numbers numerically (``"10"`` after ``"9"``),
    anything else as text after them."""
    parts = version.split(".")
    if all(p.isdigit() for p in parts):
        return (0, tuple(int(p) for p in parts))
    return (1, version)


@dataclass(frozen=True, slots=True)
class Served:
    """A stored bundle this process serves, and the code it runs on."""

    bundle: Bundle
    definition: WorkflowDef


class Registry:
    """What an app registered (workflow versions, prompts, model settings,
    tools), its bundles, and the stored bundles it serves.

    Bundles are computed from what is registered when first needed (a run
    started, a worker refreshing), and again after any registration, so a
    prompt registered after the workflow is part of its bundle."""

    #: how often a worker looks for bundles registered elsewhere (and says it serves its own)
    REFRESH_SECONDS = 1.0

    def __init__(self) -> None:
        self.versions: dict[tuple[str, str], WorkflowDef] = {}
        self.prompts: dict[str, str] = {}
        self.models: dict[str, Any] = {}
        self.tools: dict[str, dict[str, Any]] = {}
        self._lock = threading.RLock()
        self._local: dict[tuple[str, str], Bundle] | None = None
        self._published: set[str] = set()
        #: stored bundles this process serves, by id (its own included once published)
        self._served: dict[str, Served] = {}
        #: stored bundles refused for drift, with why (logged once each)
        self.refused: dict[str, str] = {}
        self._known: dict[str, Bundle] = {}

    # -- registration ------------------------------------------------------------

    def add_workflow(self, definition: WorkflowDef) -> None:
        key = (definition.name, definition.version)
        with self._lock:
            existing = self.versions.get(key)
            if existing is not None and existing.fn is not definition.fn:
                raise ValueError(f"workflow {definition.name!r} version {definition.version!r} is already "
                                 "registered: register the new code under a new version")
            self.versions[key] = definition
            self._local = None

    def add_prompt(self, name: str, text: str) -> None:
        with self._lock:
            self.prompts[name] = text
            self._local = None

    def add_model(self, name: str, settings: Mapping[str, Any]) -> None:
        with self._lock:
            self.models[name] = dict(settings)
            self._local = None

    def add_tool(self, fingerprint: dict[str, Any]) -> None:
        with self._lock:
            self.tools[str(fingerprint["name"])] = fingerprint
            self._local = None

    def newest(self, name: str) -> WorkflowDef | None:
        """The newest registered version of workflow ``name``."""
        with self._lock:
            found = [d for (n, _), d in self.versions.items() if n == name]
        return max(found, key=lambda d: version_key(d.version)) if found else None

    def version(self, name: str, version: str) -> WorkflowDef | None:
        return self.versions.get((name, version))

    # -- bundles -------------------------------------------------------------------

    def local(self) -> dict[tuple[str, str], Bundle]:
        """This process's bundles, one per registered workflow version."""
        with self._lock:
            if self._local is None:
                self._local = {
                    key: Bundle.build(d.name, d.version, code_hash(d.fn), self.prompts, self.models,
                                      list(self.tools.values()))
                    for key, d in self.versions.items()
                }
                for key, bundle in self._local.items():
                    self._served[bundle.bundle_id] = Served(bundle, self.versions[key])
                    self._known[bundle.bundle_id] = bundle
            return self._local

    def bundle_for(self, definition: WorkflowDef, store: Store) -> Bundle:
        """The bundle a new run of ``definition`` records, stored if it is not yet."""
        bundle = self.local()[(definition.name, definition.version)]
        if bundle.bundle_id not in self._published:
            store.put_bundles([bundle.record()])
            self._published.add(bundle.bundle_id)
        return bundle

    def child_bundle(self, definition: WorkflowDef, store: Store) -> str | None:
        """The bundle id a child run of ``definition`` records (``None`` if
        the definition was not registered through an app)."""
        if self.versions.get((definition.name, definition.version)) is not definition:
            return None
        return self.bundle_for(definition, store).bundle_id

    def publish(self, store: Store) -> None:
        """Store every bundle of this process (a worker starting)."""
        fresh = [b for b in self.local().values() if b.bundle_id not in self._published]
        store.put_bundles([b.record() for b in fresh])
        self._published.update(b.bundle_id for b in fresh)

    def refresh(self, store: Store) -> set[str]:
        """Read the stored bundles of this process's workflows; serve those
        whose code this process has (same name, version and code hash), and
        refuse, with one log line each, those of a registered name and
        version whose code differs. Returns the ids served."""
        local = self.local()
        names = {name for name, _ in local}
        for record in store.bundles(names):
            bid = record.bundle_id
            if bid in self._served or bid in self.refused:
                continue
            try:
                bundle = Bundle.from_record(record)
            except BundleDamaged as exc:
                self.refused[bid] = str(exc)
                log.error("refusing bundle %s: %s", bid, exc)
                continue
            mine = local.get((bundle.workflow, bundle.version))
            if mine is None:
                continue  # a version this process does not have: not ours to judge
            drift = self._drift(mine, bundle)
            if drift is not None:
                kind, why = drift
                self.refused[bid] = why
                log.error("refusing to claim runs of bundle %s (%s): %s", bid, kind, why)
                continue
            with self._lock:
                self._served[bid] = Served(bundle, self.versions[(bundle.workflow, bundle.version)])
                self._known[bid] = bundle
        return self.served_ids()

    def _drift(self, mine: Bundle, stored: Bundle) -> tuple[str, str] | None:
        """Why this process must not run ``stored`` (a bundle of a workflow
        version it registered as ``mine``), if it must not: its code differs,
        or a tool the bundle pinned is missing here or declared otherwise (a
        ``write`` re-declared ``read`` would be re-sent on replay instead of
        reconciled). Prompts and model settings are read from ``stored``."""
        where = f"workflow {stored.workflow!r} version {stored.version!r}"
        if not self._same_code(mine, stored):
            return "code drift", (
                f"{where}: the code here hashes to {mine.code}, the bundle was registered with {stored.code}; "
                "deploy the code it was registered with, or register the new code as a new version")
        here = {str(t["name"]): t for t in mine.tools}
        for pinned in stored.tools:
            name = str(pinned["name"])
            found = here.get(name)
            if found == pinned:
                continue
            if found is None:
                change = "is not registered here"
            else:
                change = "is declared otherwise here: " + ", ".join(
                    f"{key} {pinned.get(key)!r} pinned, {found.get(key)!r} here"
                    for key in sorted(set(pinned) | set(found)) if pinned.get(key) != found.get(key))
            return "tool drift", (
                f"{where}: tool {name!r} {change}; deploy the tools the bundle was registered with, or "
                "register the changed tools with a new version of the workflow")
        return None

    def _same_code(self, mine: Bundle, stored: Bundle) -> bool:
        return mine.code == stored.code

    def served_ids(self) -> set[str]:
        self.local()
        with self._lock:
            return set(self._served)

    def served(self, bid: str, store: Store | None = None) -> Served | None:
        """What serves bundle ``bid`` here; ``None`` if nothing does (a
        ``store`` given: after looking for it there once)."""
        self.local()
        found = self._served.get(bid)
        if found is None and store is not None and bid not in self.refused:
            self.refresh(store)
            found = self._served.get(bid)
        return found

    def definition_for(self, run: RunRecord, store: Store | None = None) -> WorkflowDef | None:
        """The code run ``run`` executes on here: its bundle's; for a run
        older than bundles, its version if registered, else the newest."""
        if run.bundle is None:
            return self.version(run.workflow, run.workflow_version) or self.newest(run.workflow)
        served = self.served(run.bundle, store)
        return None if served is None else served.definition

    def why_not(self, bid: str) -> str:
        return self.refused.get(bid) or "no registered workflow version has its code"

    def remember(self, bundle: Bundle) -> None:
        """Know ``bundle`` without a store (a run export carries its own)."""
        self._known[bundle.bundle_id] = bundle

    def load(self, bid: str, store: Store) -> Bundle:
        """Stored bundle ``bid``, checked against its id (cached)."""
        known = self._known.get(bid)
        if known is not None:
            return known
        for record in store.bundles(None):
            if record.bundle_id == bid:
                bundle = Bundle.from_record(record)
                self._known[bid] = bundle
                return bundle
        raise BundleDamaged(f"no stored bundle {bid}")
