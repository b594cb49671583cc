"""The one codec layer every stored value passes through.

``PayloadCodec`` turns a value into a ``Payload`` (inline JSON bytes, or a
reference to a content-addressed artifact when the bytes exceed a threshold)
and back. Keeping this in one place is what lets encryption at rest slot in
later as one more stage between the bytes and the store.
"""

from __future__ import annotations

from typing import Any

from cairn.codec import values
from cairn.errors import PayloadError, SecretLeak
from cairn.security import redaction
from cairn.store.contract import Store
from cairn.store.records import Payload
from cairn.store.retention import EXPIRED_TAG, expired_reason

#: Values whose JSON is larger than this go to the artifact store.
DEFAULT_INLINE_LIMIT = 256 * 1024


class PayloadCodec:
    """Encodes values for one store, offloading large ones to its artifacts."""

    def __init__(self, store: Store, inline_limit: int = DEFAULT_INLINE_LIMIT) -> None:
        self.store = store
        self.inline_limit = inline_limit

    def dump(self, value: Any) -> tuple[Payload, bytes]:
        """Encode ``value``; return the payload to store and the raw JSON bytes."""
        data = values.encode(value)
        return self.wrap(data), data

    def wrap(self, data: bytes) -> Payload:
        """The payload for already-encoded JSON bytes (inline, or an artifact).

        Every stored value passes here, so this is where a secret's revealed
        value is refused (``SecretLeak``) before it could reach the journal
        or an artifact: a body that returns the token it was handed, or puts
        it into a model message. Free while nothing was revealed."""
        if redaction.active():
            leaked = redaction.scan(data)
            if leaked is not None:
                raise SecretLeak(f"the value holds the revealed value of secret {leaked!r}: record the "
                                 "cairn.Secret reference instead, never what reveal() returned")
        if len(data) > self.inline_limit:
            return Payload(ref=self.store.put_artifact(data))
        return Payload(data=data)

    def raw(self, payload: Payload, *, what: str) -> bytes:
        """The JSON bytes behind ``payload`` (fetching an artifact if needed)."""
        if payload.data is not None:
            if payload.data[:2] == EXPIRED_TAG:  # retention removed the body (store.retention)
                raise PayloadError(f"cannot load {what}: {expired_reason(payload.data)}")
            return payload.data
        if payload.ref is not None:
            try:
                return self.store.get_artifact(payload.ref)
            except PayloadError as exc:
                raise PayloadError(f"cannot load {what}: {exc}") from None
        raise PayloadError(f"cannot decode {what}: it is empty")

    def load(self, payload: Payload, type_: Any = Any, *, what: str) -> Any:
        """Decode ``payload`` into ``type_``; errors name ``what`` (run and step)."""
        return values.decode(self.raw(payload, what=what), type_, what=what)
