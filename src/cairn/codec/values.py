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

import hashlib
import sys
from collections.abc import Callable
from typing import Any

import msgspec

from cairn.errors import PayloadError


def enc_hook(value: Any) -> Any:
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    raise NotImplementedError(
        f"cannot encode {type(value).__qualname__}: use JSON types, dataclasses, msgspec Structs "
        "or pydantic models"
    )


def dec_hook(type_: type, obj: Any) -> Any:
    if type_ is object:  # ``object`` accepts anything: keep the plain JSON value
        return obj
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(type_, type) and issubclass(type_, pydantic.BaseModel):
        return type_.model_validate(obj)  # type: ignore[attr-defined]
    raise NotImplementedError(f"cannot decode into {type_!r}")


_ENCODER = msgspec.json.Encoder(enc_hook=enc_hook, order="deterministic")
_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


def encode(value: Any) -> bytes:
    """JSON bytes for ``value``; ``PayloadError`` if it holds an unsupported type.

    Encoding is deterministic (sorted mapping keys), so equal values give equal
    bytes and input hashes are stable across processes.
    """
    try:
        return _ENCODER.encode(value)
    except (TypeError, NotImplementedError, OverflowError, msgspec.EncodeError) as exc:
        raise PayloadError(f"cannot encode value: {exc}") from None


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
    _decoders[type_] = decoder
    return decoder


def decode(data: bytes, type_: Any = Any, *, what: str | Callable[[], str] = "payload") -> Any:
    """Decode ``data`` into ``type_``. Errors name ``what`` was being decoded
    (a callable is only called then: journaled calls decode on every record,
    and formatting a description each time would cost more than decoding)."""
    try:
        return decoder_for(type_).decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, NotImplementedError, ValueError) as exc:
        raise PayloadError(f"cannot decode {what() if callable(what) else what}: {exc}") from None


def digest(data: bytes) -> str:
    """A short stable fingerprint of encoded bytes (the journal's input hash)."""
    return hashlib.blake2b(data, digest_size=8).hexdigest()
