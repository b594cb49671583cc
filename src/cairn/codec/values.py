"""Turning Python values into JSON bytes and back, without pickle.

Decoding is *type-directed*: the target type always comes from code (a step's
return annotation, a workflow's parameter annotations), never from the stored
bytes. Stored data can therefore only ever become plain JSON values or
instances of types the program itself named, so a crafted payload cannot make
the decoder import a module or call anything.

msgspec does the work: it natively handles dataclasses, ``datetime``/``date``/
``time``/``timedelta``, ``UUID``, ``Decimal``, ``bytes`` (base64), enums,
tuples, sets, ``TypedDict``, ``NamedTuple`` and its own ``Struct``. Pydantic
models (optional dependency) go through ``model_dump``/``model_validate``.
"""

from __future__ import annotations

import array
import dataclasses
import hashlib
import itertools
import math
import re
import sys
from collections.abc import Callable
from typing import Any

import msgspec

from cairn.codec import upcasters
from cairn.errors import PayloadError, SecretLeak
from cairn.security.secrets import SecretValue


def enc_hook(value: Any) -> Any:
    if isinstance(value, SecretValue):
        raise SecretLeak(secret_leak(value))
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(value, pydantic.BaseModel):
        return _dump_model(value, pydantic)
    if pydantic is not None and isinstance(value, (pydantic.SecretStr, pydantic.SecretBytes)):
        raise PayloadError(_SECRET)
    raise NotImplementedError(
        f"cannot encode {type(value).__qualname__}: use JSON types, dataclasses, msgspec Structs "
        "or pydantic models"
    )


def dec_hook(type_: type, obj: Any) -> Any:
    if type_ is object:  # ``object`` accepts anything: keep the plain JSON value
        return obj
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(type_, type) and issubclass(type_, pydantic.BaseModel):
        # recorded by field name (``_dump_model``), so read by field name even where aliases exist;
        # aliases are accepted too, for JSON written by others (``cairn start --input``)
        return type_.model_validate(obj, by_alias=True, by_name=True)  # type: ignore[attr-defined]
    raise NotImplementedError(f"cannot decode into {type_!r}")


_SECRET = ("a pydantic SecretStr/SecretBytes cannot be recorded: it would be stored as '**********' and "
           "come back as that, not the secret; pass a reference to the secret instead (cairn.Secret)")


def secret_leak(value: SecretValue, where: str = "") -> str:
    """Why a resolved secret is refused (``where`` names the field, if known).

    A ``cairn.Secret`` is recorded as its reference (name, provider, version,
    scope: never the value); a ``SecretValue`` is what a provider resolved
    it to, and recording it would write the credential into the journal."""
    name = value.ref.name if value.ref is not None else None
    at = f"{where}: " if where else ""
    return (f"{at}a resolved secret (SecretValue {name!r}) cannot be recorded: pass or return the "
            "cairn.Secret reference; it is resolved again where it is used")


def _dump_model(model: Any, pydantic: Any) -> Any:
    """A pydantic model as JSON values that ``dec_hook`` turns back into an
    equal model: by field name (an alias is how the model is *read*, and
    ``dec_hook`` reads by name), without computed fields (a model with
    ``extra="forbid"`` refuses them back), and with sets in a canonical order
    (``model_dump`` lists a set in hash order, which differs per process and
    would make input hashes differ across processes). Secrets, bytes that are
    not UTF-8 (pydantic writes bytes as text) and what else cannot be
    written are refused naming the field."""
    _refuse_unrecordable(model, pydantic, type(model).__name__)
    try:
        dumped = model.model_dump(mode="json", by_alias=False, exclude_computed_fields=True)
    except (ValueError, TypeError, pydantic.PydanticSerializationError) as exc:
        raise PayloadError(f"{type(model).__name__}: {exc}") from None
    return _canonical(model, dumped, pydantic)


def _refuse_unrecordable(value: Any, pydantic: Any, path: str) -> None:
    if isinstance(value, SecretValue):
        raise SecretLeak(secret_leak(value, path))
    if isinstance(value, (pydantic.SecretStr, pydantic.SecretBytes)):
        raise PayloadError(f"{path}: {_SECRET}")
    if isinstance(value, bytes):
        try:
            value.decode()
        except UnicodeDecodeError:
            raise PayloadError(f"{path}: bytes that are not UTF-8 cannot be recorded inside a pydantic model "
                               "(pydantic writes bytes as text); annotate the field as Base64Bytes") from None
    elif isinstance(value, pydantic.BaseModel):
        for name in type(value).model_fields:
            _refuse_unrecordable(getattr(value, name, None), pydantic, f"{path}.{name}")
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_unrecordable(item, pydantic, f"{path}[{key!r}]")
    elif isinstance(value, (list, tuple, set, frozenset)):
        for i, item in enumerate(value):
            _refuse_unrecordable(item, pydantic, f"{path}[{i}]")


def _canonical(value: Any, dumped: Any, pydantic: Any) -> Any:
    """``dumped`` (what ``model_dump`` made of ``value``) with every set's
    elements sorted by their encoded form. Both are walked together: a set
    was dumped in its iteration order, so the pairs line up."""
    if isinstance(value, (set, frozenset)) and isinstance(dumped, list):
        items = [_canonical(v, d, pydantic) for v, d in zip(value, dumped, strict=False)]
        return sorted(items, key=_ENCODER.encode)
    if isinstance(value, pydantic.BaseModel) and isinstance(dumped, dict):
        for name in type(value).model_fields:
            if name in dumped:
                dumped[name] = _canonical(getattr(value, name, None), dumped[name], pydantic)
        return dumped
    if isinstance(value, dict) and isinstance(dumped, dict) and len(value) == len(dumped):
        pairs = zip(dumped.items(), value.values(), strict=True)
        return {k: _canonical(v, d, pydantic) for (k, d), v in pairs}
    if isinstance(value, (list, tuple)) and isinstance(dumped, list) and len(value) == len(dumped):
        return [_canonical(v, d, pydantic) for v, d in zip(value, dumped, strict=True)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and isinstance(dumped, dict):
        for f in dataclasses.fields(value):
            if f.name in dumped:
                dumped[f.name] = _canonical(getattr(value, f.name), dumped[f.name], pydantic)
    return dumped


def _non_finite(value: Any, path: str) -> str | None:
    """Where ``value`` (plain builtins) holds a NaN or an infinity, if anywhere."""
    if isinstance(value, float):
        return path if not math.isfinite(value) else None
    if isinstance(value, dict):
        items: Any = ((f"{path}[{k!r}]", v) for k, v in value.items())
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for where, item in items:
        found = _non_finite(item, where)
        if found is not None:
            return found
    return None


def _find_secret(value: Any, path: str, depth: int) -> tuple[str, SecretValue] | None:
    """Where in ``value`` a ``SecretValue`` sits (only walked once one was
    met while encoding: to name the field in the error)."""
    if isinstance(value, SecretValue):
        return path, value
    if depth > 64:
        return None
    if isinstance(value, dict):
        items: Any = ((f"{path}[{k!r}]", v) for k, v in value.items())
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, msgspec.Struct):
        items = ((f"{path}.{f}", getattr(value, f, None)) for f in value.__struct_fields__)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = ((f"{path}.{f.name}", getattr(value, f.name, None)) for f in dataclasses.fields(value))
    else:
        return None
    for where, item in items:
        found = _find_secret(item, where, depth + 1)
        if found is not None:
            return found
    return None


#: How deeply a stored value may nest (``[]`` is 1, ``{"a": []}`` 2). Well
#: below what a read can take: decoding (msgspec, and ``json`` answering it
#: over HTTP) recurses once a level on the Python stack, so a value stored
#: at the old limit (whatever the writer's stack left of the recursion
#: limit) failed every later read of its run, from a deeper stack.
MAX_DEPTH = 256
#: The integers a value may hold: 64 bits, signed or not. JSON has no limit,
#: but its readers do (JavaScript, the dashboard, keeps 53 bits; MessagePack
#: and most languages 64), and a larger one used to escape as a raw
#: ``OverflowError``.
MIN_INT, MAX_INT = -(2**63), 2**64 - 1
#: Prefilters, so that ordinary values pay two ``bytes.count`` and one
#: search: an integer beyond 64 bits has at least 19 digits (a float is written with at
#: most 17), and a value is only nested past ``MAX_DEPTH`` with that many
#: brackets. Digits or brackets inside strings match too; the check decides.
#: (Run as a translation of every digit to "0" and every other byte to " ", then
#: a substring search for 19 "0"s: a C-speed pass, where the regex ``[0-9]{19,}``
#: tried each position: 8.4 us against 1.0 us for 1 KB of text, on every value stored.)
_DIGITS_ONLY = bytes(48 if 48 <= byte <= 57 else 32 for byte in range(256))
_LONG_RUN = b"0" * 19
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKETS = bytes(range(256)).translate(None, b"[]{}")
_DEPTH_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")

_ENCODER = msgspec.json.Encoder(enc_hook=enc_hook, order="deterministic")
#: A cheap prefilter for NaN/infinity: MessagePack writes a float as 0xcb and
#: eight big-endian bytes, whose exponent bits are all ones only for those.
#: (Bytes inside strings may match too; the walk that follows decides.)
_PACKER = msgspec.msgpack.Encoder(enc_hook=enc_hook)
_NON_FINITE_FLOAT64 = re.compile(rb"\xcb[\x7f\xff][\xf0-\xff]")
_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


def encode(value: Any, as_type: Any = None) -> bytes:
    """JSON bytes for ``value``; ``PayloadError`` if it holds an unsupported
    type, a NaN or an infinity (JSON has neither: they would come back as
    ``None``), text with a lone surrogate, or is nested too deeply.

    Encoding is deterministic (sorted mapping keys and sets), so equal values
    give equal bytes and input hashes are stable across processes.

    ``as_type`` is the type the value will be decoded into (a step's result
    annotation): where it holds versioned state types, their values record
    their versions (``codec.upcasters``); elsewhere only a value of a
    versioned type itself does. Nothing is walked for a type that holds none.
    """
    try:
        version = getattr(type(value), "__cairn_version__", None)
        if as_type is not None and _VERSIONED and _versioned(as_type):  # versioned types inside: mark them
            value = upcasters.mark_versions(as_type, value, msgspec.to_builtins(value, enc_hook=enc_hook))
        elif version is not None:  # a versioned state type: record the version (codec.upcasters)
            value = _with_version(value, version)
        data = _ENCODER.encode(value)
    except SecretLeak as leak:
        found = _find_secret(value, "value", 0)
        if found is None:
            raise
        raise SecretLeak(secret_leak(found[1], found[0])) from leak.__cause__
    except (TypeError, NotImplementedError, OverflowError, msgspec.EncodeError) as exc:
        raise PayloadError(f"cannot encode value: {exc}") from None
    except UnicodeEncodeError as exc:  # a lone surrogate: text JSON (UTF-8) cannot hold
        raise PayloadError(f"cannot encode value: it holds text that is not valid Unicode ({exc})") from None
    except RecursionError:
        raise PayloadError("cannot encode value: it is nested too deeply") from None
    _check_limits(value, data)
    # NaN and infinities are written as null; only then, and only if the value's
    # MessagePack form (which keeps them, as float64) may hold one, find where
    if b"null" in data and _NON_FINITE_FLOAT64.search(_PACKER.encode(value)):
        try:
            where = _non_finite(msgspec.to_builtins(value, enc_hook=enc_hook), "value")
        except RecursionError:
            where = None
        if where is not None:
            raise PayloadError(f"cannot encode value: {where} is not a finite number (NaN and infinity "
                               "have no JSON form)")
    return data


def _check_limits(value: Any, data: bytes) -> None:
    """Refuse (``PayloadError``) a value nested deeper than ``MAX_DEPTH`` or
    holding an integer outside ``MIN_INT``..``MAX_INT``: the same rule for
    every value stored (inputs, results, signals, edits), on every backend."""
    if data.count(b"[") + data.count(b"{") >= MAX_DEPTH:
        depth = nesting(data)
        if depth > MAX_DEPTH:
            raise PayloadError(f"cannot encode value: it is nested too deeply ({depth} levels; at most "
                               f"{MAX_DEPTH} are stored)")
    if _LONG_RUN in data.translate(_DIGITS_ONLY):
        where = _huge_int(msgspec.json.decode(data), "value")
        if where is not None:
            raise PayloadError(f"cannot encode value: {where} is an integer beyond 64 bits (integers are "
                               f"stored from {MIN_INT} to {MAX_INT}); pass it as text")


def nesting(data: bytes) -> int:
    """How deeply the JSON ``data`` nests, without parsing it (so without
    recursion): strings are cut out, then the brackets left are counted up
    and down as signed bytes."""
    brackets = _STRING.sub(b"", data).translate(None, _BRACKETS).translate(_DEPTH_STEP)
    return max(itertools.accumulate(array.array("b", brackets)), default=0)


def _huge_int(value: Any, path: str) -> str | None:
    """Where plain JSON ``value`` holds an integer beyond 64 bits, if anywhere
    (only walked when the bytes hold a long run of digits)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return path if not MIN_INT <= value <= MAX_INT else None
    if isinstance(value, dict):
        items: Any = ((f"{path}[{k!r}]", v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for where, item in items:
        found = _huge_int(item, where)
        if found is not None:
            return found
    return None


def _with_version(value: Any, version: Any) -> Any:
    plain = msgspec.to_builtins(value, enc_hook=enc_hook)
    if isinstance(plain, dict):
        plain[upcasters.VERSION_KEY] = version
    return plain


#: the types decoders were built for that are or hold a versioned state type (``codec.upcasters``)
_VERSIONED: dict[Any, int] = {}


def _versioned(type_: Any) -> bool:
    try:
        return type_ in _VERSIONED
    except TypeError:  # an unhashable annotation
        return False


def _fits(obj: Any, type_: Any) -> bool:
    try:
        msgspec.convert(obj, type_, dec_hook=dec_hook)
    except (msgspec.ValidationError, NotImplementedError, ValueError, TypeError):
        return False
    return True


def decoder_for(type_: Any) -> msgspec.json.Decoder[Any]:
    """A (cached) decoder producing ``type_``; ``Any`` gives plain JSON values."""
    try:
        return _decoders[type_]
    except KeyError:
        pass
    except TypeError:  # unhashable annotation: build one each time
        return msgspec.json.Decoder(type_, dec_hook=dec_hook)
    try:
        decoder = msgspec.json.Decoder(type_, dec_hook=dec_hook)
    except TypeError as exc:
        raise PayloadError(f"type {type_!r} cannot be decoded from JSON: {exc}") from None
    if upcasters.versioned_in(type_):
        _VERSIONED[type_] = upcasters.schema_version(type_) or 0
    _decoders[type_] = decoder
    return decoder


def decode(data: bytes, type_: Any = Any, *, what: str | Callable[[], str] = "payload") -> Any:
    """Decode ``data`` into ``type_``. Errors name ``what`` was being decoded
    (a callable is only called then: journaled calls decode on every record,
    and formatting a description each time would cost more than decoding)."""
    try:
        decoder = decoder_for(type_)
        if _VERSIONED and _versioned(type_):
            plain = upcasters.upcast_tree(type_, msgspec.json.decode(data), _fits)
            return msgspec.convert(plain, type_, dec_hook=dec_hook)
        return decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, NotImplementedError, ValueError) as exc:
        raise PayloadError(f"cannot decode {what() if callable(what) else what}: {exc}") from None
    except RecursionError:
        raise PayloadError(f"cannot decode {what() if callable(what) else what}: nested too deeply") from None


def digest(data: bytes) -> str:
    """A short stable fingerprint of encoded bytes (the journal's input hash)."""
    return hashlib.blake2b(data, digest_size=8).hexdigest()
