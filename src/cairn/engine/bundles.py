"""Bundles: what decides a run's behaviour, pinned at its start.

A bundle is a workflow's name and version, the hash of its code, and the
prompts, model settings and tools registered with the app. Its id is a
hash of that content (``bundle_id``), so it is stable across processes and
machines: the same code and settings give the same id everywhere, and any
change to one of them gives a new id.

What changes the id:

* the workflow's **code**: the function's syntax tree and what it reaches in
  its own package (``code_hash``, ``_Reach``): helpers, classes, module
  constants, the statements binding module-level values it reads, and a
  decorator between ``@app.workflow`` and the function;
* its name or version;
* any prompt or model setting registered with the app (``app.prompt``,
  ``app.model_settings``), added, removed or changed;
* any tool registered with the app: its name, effect class, parameters,
  result schema or access rule (``cairn.ToolAccess``: tenants, workflows,
  role). An MCP server's rules (``MCPServer(access=..., effects=...)``) and
  a context policy are the code's: a module-level value the workflow reads
  is in its code hash.

What does not: comments, blank lines, formatting, the docstring, the
Python name of the workflow function, decorators above ``@app.workflow``;
the rest of its module; the bodies of steps and tools (their outcomes are
journaled, so replay never runs them); anything else in the process. The
Python version does not either, as long as the source is available
(without it, the bytecode is hashed in a canonical form, which depends on
it but not on ``PYTHONHASHSEED``).

A run records its bundle id at start. A worker serves a stored bundle when
it has the same workflow name and version with the same code hash and the
tools the bundle pinned (code and tools are what must match: prompts and
model settings are read from the stored bundle, never from the process),
and refuses one whose code or tools differ
(``Registry.refresh`` logs why, once): silent drift is the failure this
prevents. Several versions of one workflow are served side by side: each run
executes on the code of its own bundle.
"""

from __future__ import annotations

import ast
import dis
import enum
import hashlib
import importlib.util
import inspect
import logging
import sys
import textwrap
import threading
import types
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

import msgspec

from cairn.engine import codecache
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
    """A hash of the code workflow function ``fn`` runs: the function and
    what it reaches in its own package (``_Reach``), each piece as its syntax
    tree without positions, docstring or the function's own name, so
    comments and formatting do not count. Without source, the bytecode in a
    canonical form (constants in an order that does not depend on
    ``PYTHONHASHSEED``). Stable across processes; see ``_Reach`` for what
    is reached. A graph workflow (``__cairn_graph__``) hashes its structure
    (nodes, edges, routers, state fields and reducers) and what each node,
    router and reducer reaches: the runner itself is Cairn's code."""
    graph = getattr(fn, "__cairn_graph__", None)
    if graph is not None:  # a graph workflow (``cairn.graph``): its shape, what each function reaches
        tree = {"graph": graph.structure(), "reach": [_Reach(part).root() for part in graph.callables()]}
    else:
        tree = _Reach(fn).root()
    return "reach:" + hashlib.sha256(_ENCODER.encode(tree)).hexdigest()[:32]


def legacy_code_hash(fn: Callable[..., Any]) -> str:
    """The code hash of bundles stored before it covered what a workflow
    reaches (``ast:``/``bytecode:``): the function's own syntax tree. Kept
    so that runs started then are still served by the same code."""
    target = inspect.unwrap(fn)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(target)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return "bytecode:" + hashlib.sha256(_legacy_code_bytes(target.__code__)).hexdigest()[:32]
    node = tree.body[0] if tree.body else tree
    dumped = ast.dump(_strip(node), annotate_fields=True, include_attributes=False)
    return "ast:" + hashlib.sha256(dumped.encode()).hexdigest()[:32]


def _legacy_code_bytes(code: CodeType) -> bytes:
    parts = [code.co_code, repr(code.co_names).encode(), repr(code.co_varnames).encode()]
    for const in code.co_consts:
        parts.append(_legacy_code_bytes(const) if isinstance(const, CodeType) else repr(const).encode())
    return b"\x00".join(parts)


def _strip(node: ast.AST) -> ast.AST:
    """A function's node without what is not its behaviour: its decorators
    (those below ``@app.workflow`` are reached as wrappers, those above do
    not wrap what was registered), its name and its docstring."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        node.decorator_list = []
        node.name = "_"  # the workflow's name is in the bundle; the function's is not behaviour
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str) and len(body) > 1:
            node.body = body[1:]
    return node


def _canonical_code(code: CodeType) -> str:
    """Bytecode and its constants, names and variables, in a form that does
    not depend on the process: a frozenset constant (a set literal in an
    ``in`` test) is listed sorted, not in hash order."""
    parts = [code.co_code.hex(), repr(code.co_names), repr(code.co_varnames), repr(code.co_freevars)]
    parts.extend(_canonical_const(const) for const in code.co_consts)
    return "\x00".join(parts)


def _canonical_const(const: Any) -> str:
    if isinstance(const, CodeType):
        return "code(" + _canonical_code(const) + ")"
    if isinstance(const, frozenset):
        return "frozenset(" + ",".join(sorted(_canonical_const(c) for c in const)) + ")"
    if isinstance(const, tuple):
        return "(" + ",".join(_canonical_const(c) for c in const) + ")"
    return repr(const)


_LOADS_GLOBAL = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"})
_LOADS_ATTR = frozenset({"LOAD_ATTR", "LOAD_METHOD", "IMPORT_FROM"})
_IMMUTABLE = (bool, int, float, complex, str, bytes, type(None))


def _names(code: CodeType) -> tuple[set[str], set[str]]:
    """The global names ``code`` (and the code nested in it) reads, and the
    attribute names it reads (of a module it reads: the module's names it uses)."""
    globals_: set[str] = set()
    attrs: set[str] = set()
    for instruction in dis.get_instructions(code):
        if instruction.opname in _LOADS_GLOBAL:
            globals_.add(str(instruction.argval))
        elif instruction.opname in _LOADS_ATTR:
            attrs.add(str(instruction.argval))
    for const in code.co_consts:
        if isinstance(const, CodeType):
            inner_globals, inner_attrs = _names(const)
            globals_ |= inner_globals
            attrs |= inner_attrs
    return globals_, attrs


@dataclass(frozen=True, slots=True)
class _Facts:
    """What the walk needs of a code object's bytecode (and its nested code's)."""

    globals: frozenset[str]
    attrs: frozenset[str]
    imports: frozenset[tuple[str, int]]


class _FactsWire(msgspec.Struct, array_like=True):
    globals: list[str]
    attrs: list[str]
    imports: list[tuple[str, int]]


def _facts(code: CodeType) -> _Facts:
    """``_names`` and ``_imports`` of ``code``, from the code-hash cache:
    disassembling is most of what hashing costs once sources come from the
    cache, and both are a function of the canonical bytecode (its
    instructions, names and constants, nested code included), which is 20
    times cheaper to compute than the walk."""
    def compute() -> str:
        global_names, attrs = _names(code)
        wire = _FactsWire(sorted(global_names), sorted(attrs), sorted(_imports(code)))
        return _ENCODER.encode(wire).decode()

    encoded = codecache.keyed("bytecode-facts", _canonical_code(code), compute)
    try:
        wire = msgspec.json.decode(encoded, type=_FactsWire)
    except (msgspec.DecodeError, msgspec.ValidationError):
        wire = msgspec.json.decode(compute(), type=_FactsWire)
    imports = frozenset((name, level) for name, level in wire.imports)
    return _Facts(frozenset(wire.globals), frozenset(wire.attrs), imports)


def _imports(code: CodeType) -> set[tuple[str, int]]:
    """The modules ``code`` (and the code nested in it) imports in its body,
    with their relative level (``from .helpers import fee`` inside a function)."""
    found: set[tuple[str, int]] = set()
    instructions = list(dis.get_instructions(code))
    for i, instruction in enumerate(instructions):
        if instruction.opname == "IMPORT_NAME":
            level = instructions[i - 2].argval if i >= 2 and instructions[i - 2].opname == "LOAD_CONST" else 0
            found.add((str(instruction.argval), level if isinstance(level, int) else 0))
    for const in code.co_consts:
        if isinstance(const, CodeType):
            found |= _imports(const)
    return found


class _Reach:
    """What a workflow's code hash covers, as one JSON-able tree.

    From the registered function (a wrapper too: a decorator between
    ``@app.workflow`` and the function is what runs), it follows every
    global name the code reads, its closure, its defaults and
    ``__wrapped__``. Objects of the workflow's own top-level package are
    followed into: functions (their code, then what they reach), classes
    (their source and methods), modules (the names of them the code uses).
    A value that cannot change in-process is hashed as its value (a
    constant: also one computed at import, from the environment); any other
    module-level value (a dict, a list, an object) as the source of the
    module-level statements that bind it, since its contents are state the
    process may change. Cairn's objects (steps, tools) count by their name
    (their bodies are journaled), anything outside the package by its
    qualified name; Cairn's policies (an ``MCPServer``'s rules, a
    ``ContextPolicy``, a ``ToolAccess``) by their settings (``bundle_pin``),
    wherever the code holds them (a module global, a default, a closure).
    Keys are the names the code uses, never the package's,
    so the same code under another package name hashes the same."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.package = str(getattr(inspect.unwrap(fn), "__module__", "") or "").partition(".")[0]
        self._seen: set[int] = set()
        self._modules: dict[str, ast.Module | None] = {}

    def root(self) -> Any:
        return self._value(self.fn, set(), None, 0)

    def _mine(self, module: Any) -> bool:
        name = str(module or "")
        return bool(self.package) and self.package != "cairn" and name.partition(".")[0] == self.package

    def _value(self, value: Any, attrs: set[str], binding: tuple[str, str] | None, depth: int) -> Any:
        try:
            return self._reach(value, attrs, binding, depth)
        except Exception:  # an object that resists inspection (a lazy module, a proxy): its type counts
            return {"opaque": f"{type(value).__module__}.{type(value).__qualname__}"}

    def _reach(self, value: Any, attrs: set[str], binding: tuple[str, str] | None, depth: int) -> Any:
        if depth > 40:
            return {"deep": type(value).__qualname__}
        if isinstance(value, _IMMUTABLE):
            return {"const": f"{type(value).__name__}:{value!r}"}
        if isinstance(value, tuple | frozenset):
            items = [self._value(v, attrs, None, depth + 1) for v in value]
            if isinstance(value, frozenset):
                items.sort(key=_ENCODER.encode)
            return {type(value).__name__: items}
        if isinstance(value, enum.Enum):
            return {"enum": f"{type(value).__qualname__}.{value.name}"}
        if isinstance(value, types.FunctionType):
            mine = self._mine(value.__module__)
            return self._function(value, depth) if mine else self._outside(value, depth)
        if isinstance(value, types.MethodType):
            return {"method": self._value(value.__func__, attrs, None, depth + 1),
                    "of": self._value(type(value.__self__), attrs, None, depth + 1)}
        if isinstance(value, type):
            return self._class(value, depth) if self._mine(value.__module__) else \
                {"outside": f"{value.__module__}.{value.__qualname__}"}
        if isinstance(value, types.ModuleType):
            if not self._mine(value.__name__):
                return {"outside": value.__name__}
            return {"module": {a: self._value(getattr(value, a), attrs, (value.__name__, a), depth + 1)
                               for a in sorted(attrs) if hasattr(value, a)}}
        return self._object(value, binding, depth)

    def _object(self, value: Any, binding: tuple[str, str] | None, depth: int) -> Any:
        kind = type(value)
        if kind.__module__.partition(".")[0] == "cairn":
            pin = getattr(value, "bundle_pin", None)
            if callable(pin):  # a policy (MCP server rules, context policy, access rule): its settings
                return {"cairn": kind.__qualname__, "pinned": _ENCODER.encode(pin()).decode()}
            # a step, a tool: what replay asks for is its name
            definition = getattr(value, "definition", None)
            return {"cairn": kind.__qualname__, "name": str(getattr(definition, "name", ""))}
        found: Any = {"object": self._value(kind, set(), None, depth + 1)}
        if binding is not None:
            found["binding"] = self._binding(*binding)
        return found

    def _outside(self, fn: types.FunctionType, depth: int) -> Any:
        """A function of another package: its name, and what it wraps (a
        library's decorator around the workflow's own code)."""
        found: dict[str, Any] = {"outside": f"{fn.__module__}.{fn.__qualname__}"}
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is not None:
            found["wrapped"] = self._value(wrapped, set(), None, depth + 1)
        return found

    def _function(self, fn: types.FunctionType, depth: int) -> Any:
        if id(fn) in self._seen:
            return {"ref": fn.__qualname__}
        self._seen.add(id(fn))
        code = fn.__code__
        facts = _facts(code)
        global_names, attrs = facts.globals, set(facts.attrs)
        found: dict[str, Any] = {"code": self._code(fn)}
        module = str(fn.__module__)
        found["globals"] = {name: self._value(fn.__globals__[name], attrs, (module, name), depth + 1)
                            for name in sorted(global_names) if name in fn.__globals__}
        found["imports"] = self._imported(fn, facts.imports, attrs, depth)
        closure: dict[str, Any] = {}
        for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
            try:
                closure[name] = self._value(cell.cell_contents, attrs, None, depth + 1)
            except ValueError:  # an empty cell
                continue
        found["closure"] = closure
        found["defaults"] = [self._value(v, attrs, None, depth + 1) for v in fn.__defaults__ or ()]
        found["kwdefaults"] = {k: self._value(v, attrs, None, depth + 1)
                               for k, v in sorted((fn.__kwdefaults__ or {}).items())}
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is not None:
            found["wrapped"] = self._value(wrapped, attrs, None, depth + 1)
        return found

    def _imported(self, fn: types.FunctionType, imports: Collection[tuple[str, int]], attrs: set[str],
                  depth: int) -> Any:
        """The modules of the package that ``fn`` imports in its body, each
        as the names of it the code uses."""
        found: dict[str, Any] = {}
        package = fn.__globals__.get("__package__") or str(fn.__module__).rpartition(".")[0]
        for name, level in sorted(imports):
            try:
                resolved = importlib.util.resolve_name("." * level + name, package) if level else name
            except (ImportError, ValueError):
                continue
            imported = sys.modules.get(resolved)
            if imported is not None and self._mine(resolved):
                found["." * level + name] = self._value(imported, attrs, None, depth + 1)
        return found

    def _code(self, fn: types.FunctionType) -> str:
        shell = _shell(fn)
        try:
            return codecache.cached("code", _source_file(shell), fn.__globals__,
                                    str(fn.__code__.co_firstlineno), lambda: _function_dump(shell))
        except (OSError, TypeError, SyntaxError, IndentationError):
            return "bytecode:" + _canonical_code(fn.__code__)

    def _class(self, cls: type, depth: int) -> Any:
        if id(cls) in self._seen:
            return {"ref": cls.__qualname__}
        self._seen.add(id(cls))
        found: dict[str, Any] = {}
        module = sys.modules.get(cls.__module__)
        try:
            where = f"{cls.__qualname__}:{getattr(cls, '__firstlineno__', '')}"
            found["source"] = codecache.cached("class", _source_file(cls), vars(module) if module else None,
                                               where, lambda: _class_dump(cls))
        except (OSError, TypeError, SyntaxError, IndentationError, IndexError):
            found["annotations"] = sorted(str(k) for k in vars(cls).get("__annotations__", {}))
        filename = getattr(module, "__file__", None)
        for name, member in sorted(vars(cls).items()):
            fn = getattr(member, "__func__", member)  # static and class methods
            if isinstance(member, property):
                fn = member.fget
            if isinstance(fn, types.FunctionType) and fn.__code__.co_filename == filename:
                found[f"m:{name}"] = self._function(fn, depth + 1)  # generated methods (dataclasses) are not
            elif not name.startswith("__") and isinstance(member, _IMMUTABLE):
                found[f"a:{name}"] = self._value(member, set(), None, depth + 1)
        return {"class": found}

    def _binding(self, module: str, name: str) -> list[str] | None:
        """The module-level statements of ``module`` that bind or change
        ``name`` (``None`` without source)."""
        loaded = sys.modules.get(module)
        namespace = vars(loaded) if loaded is not None else None
        try:
            encoded = codecache.cached("binding", _source_file(loaded), namespace, name,
                                       lambda: _ENCODER.encode(self._statements(module, name)).decode())
        except _NoSource:
            return None
        try:
            return msgspec.json.decode(encoded, type=list[str])
        except (msgspec.DecodeError, msgspec.ValidationError):
            return self._statements(module, name)

    def _statements(self, module: str, name: str) -> list[str]:
        if module not in self._modules:
            try:
                self._modules[module] = ast.parse(inspect.getsource(sys.modules[module]))
            except (OSError, TypeError, SyntaxError, KeyError):
                self._modules[module] = None
        tree = self._modules[module]
        if tree is None:
            raise _NoSource(module)
        return [ast.dump(statement, annotate_fields=True, include_attributes=False)
                for statement in _top_level(tree.body) if name in _bound_by(statement)]


class _NoSource(Exception):
    """A module whose source cannot be read (a ``.pyc``-only deploy)."""


def _shell(fn: types.FunctionType) -> types.FunctionType:
    """A bare function over ``fn``'s code: what ``inspect.getsource`` reads
    the code's own source from (never what ``fn`` wraps), found through its
    ``__module__``. Asked for a code object instead, ``inspect`` looks for
    its module by resolving the path of every module loaded (hundreds in a
    worker): most of a fresh process's time to hash (issue 21). The source
    is the same either way: both read ``co_filename``'s lines at
    ``co_firstlineno``."""
    return types.FunctionType(fn.__code__, fn.__globals__, fn.__code__.co_name, None, fn.__closure__)


def _source_file(obj: Any) -> str | None:
    """The file ``inspect`` reads ``obj``'s source from (``None``: none)."""
    if obj is None:
        return None
    try:
        return inspect.getsourcefile(obj)
    except TypeError:
        return None


def _function_dump(shell: types.FunctionType) -> str:
    tree = ast.parse(textwrap.dedent(inspect.getsource(shell)))
    node = tree.body[0] if tree.body else tree
    return ast.dump(_strip(node), annotate_fields=True, include_attributes=False)


def _class_dump(cls: type) -> str:
    node = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    return ast.dump(node, annotate_fields=True, include_attributes=False)


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """A module's statements, into ``if``/``try``/``with`` blocks (not into
    functions or classes)."""
    for statement in body:
        yield statement
        if isinstance(statement, ast.If | ast.With | ast.Try):
            for block in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(statement, block, [])
                if block == "handlers":
                    inner = [s for handler in inner for s in handler.body]
                yield from _top_level(inner)


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _bound_by(statement: ast.stmt) -> set[str]:
    """The names a module-level statement binds or changes in place."""
    targets: list[ast.AST] = []
    if isinstance(statement, ast.Assign):
        targets = list(statement.targets)
    elif isinstance(statement, ast.AnnAssign | ast.AugAssign):
        targets = [statement.target]
    elif isinstance(statement, ast.Import | ast.ImportFrom):
        return {(alias.asname or alias.name).partition(".")[0] for alias in statement.names}
    elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        targets = [statement.value.func]  # ``LIMITS.update(...)``
    names: set[str] = set()
    for target in targets:
        for node in ast.walk(target) if isinstance(target, ast.Tuple | ast.List) else [target]:
            root = _root_name(node)
            if root is not None:
                names.add(root)
    return names


def tool_fingerprint(name: str, effect: str, signature: str, result_type: Any,
                     access: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a bundle holds of a tool: name, effect class, parameters and
    result schema (a JSON Schema where one can be derived, else the type's
    name), and who may call it (``ToolAccess.pinned``) where the app says:
    a run is authorized by the rule it started under, since a worker whose
    rule differs does not serve its bundle (tool drift). A tool without a
    rule has no ``access`` key, so its bundles keep the ids they had."""
    schema: Any
    try:
        model_schema = getattr(result_type, "model_json_schema", None)
        schema = model_schema() if callable(model_schema) else msgspec.json.schema(result_type)
    except Exception:  # not every annotation has a JSON Schema: its name is what we can pin
        schema = getattr(result_type, "__qualname__", repr(result_type))
    pinned = {"name": name, "effect": effect, "parameters": signature, "schema": schema}
    if access is not None:
        pinned["access"] = dict(access)
    return pinned


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
                f"{where}: the code here hashes to {mine.code}, the bundle was registered with "
                f"{stored.code}; "
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
        if stored.code.startswith(("ast:", "bytecode:")):  # stored before the hash covered what code reaches
            definition = self.versions[(stored.workflow, stored.version)]
            return legacy_code_hash(definition.fn) == stored.code
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
