"""Secrets at the moment of use: what steps and tools do with ``cairn.Secret``.

A step or tool body says it wants a secret's *value* by annotating a
parameter ``cairn.SecretValue`` (or ``SecretValue | None``); its caller
passes a ``cairn.Secret`` reference there. Everything recorded about the
call (its input hash, a ``write`` tool's intent, what a reconciler and
``cairn ops`` see) holds the reference; the value is resolved just before
the body runs, on every attempt, on whichever worker runs it, and lives
only in the arguments handed to the body. (Called outside a run, in a unit
test, a step or tool is the plain function: hand it a ``SecretValue``.) A
workflow parameter or a step result annotated ``SecretValue`` is refused at
registration: both are recorded.

When the body raises ``cairn.CredentialExpired`` (or, except for a
``write`` tool, an exception a provider classifies as an expired
credential), the secrets the call used are refreshed through their
providers and the body runs again at once: same position, same attempt
number, same operation id, at most ``MAX_REFRESHES`` times per attempt. A
refresh is not a failure, so it spends nothing of the retry policy; once
the refreshes are used up the failure goes to the policy like any other
(``CredentialExpired`` is an ``EffectNotApplied``: a definite failure).

Why only ``CredentialExpired`` for a ``write`` tool: sending a write again
is safe only when the first request certainly changed nothing. An
authentication rejection proves that, but only the tool knows that is what
it got; a provider's classifier sees an exception type, not what the
service did, so for a write its word is not enough.
"""

from __future__ import annotations

import inspect
import logging
import types
import typing
from dataclasses import dataclass
from typing import Any, Protocol

from cairn.errors import CredentialExpired, PayloadError, SecretError
from cairn.security import redaction
from cairn.security.secrets import Access, Secret, Secrets, SecretValue, as_ref
from cairn.store.records import RunRecord

log = logging.getLogger("cairn.secrets")

#: How many times one attempt is refreshed and run again after an expired credential.
MAX_REFRESHES = 2


class _Resolving(Protocol):
    @property
    def secrets(self) -> Secrets: ...


class Executing(Protocol):
    """What this module needs of the execution making a call: the run it
    executes (whose identity a provider is shown, ``Access``) and the
    process's secrets (``runtime.secrets``). ``engine.execution.Execution``
    is one; named by this Protocol because that module sits above this one
    (the definitions it imports import this module)."""

    @property
    def run(self) -> RunRecord: ...

    @property
    def run_id(self) -> str: ...

    @property
    def runtime(self) -> _Resolving: ...


def wants_value(annotation: Any) -> bool:
    """``SecretValue``, or ``SecretValue | None`` / ``Optional[SecretValue]``."""
    if annotation is SecretValue:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        return SecretValue in args and all(a in (SecretValue, type(None)) for a in args)
    return False


@dataclass(frozen=True, slots=True)
class SecretParams:
    """The parameters of a body that take a resolved secret, found once at
    registration (``None`` for the many bodies that take none, so the hot
    path pays one ``is None`` test)."""

    signature: inspect.Signature
    names: frozenset[str]

    @classmethod
    def of(cls, signature: inspect.Signature, hints: dict[str, Any]) -> SecretParams | None:
        plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                 inspect.Parameter.KEYWORD_ONLY)
        names = frozenset(p.name for p in signature.parameters.values()
                          if p.kind in plain and wants_value(hints.get(p.name)))
        return cls(signature, names) if names else None

    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any], what: str) -> None:
        """Refuse, at the call and before anything is recorded, a value where
        a reference belongs: whatever is passed there would be journaled."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:
            return  # the body's own call reports it
        for name in self.names:
            value = bound.arguments.get(name)
            if value is None or as_ref(value) is not None:
                continue
            kind = "resolved SecretValue" if isinstance(value, SecretValue) else type(value).__name__
            raise PayloadError(
                f"{what}: parameter {name!r} takes a cairn.Secret reference, not a {kind}: pass "
                "cairn.Secret('NAME'); its value is resolved when the body runs and is never recorded")

    def resolve(
        self, ex: Executing, args: tuple[Any, ...], kwargs: dict[str, Any], what: str
    ) -> tuple[tuple[Any, ...], dict[str, Any], tuple[Secret, ...]]:
        """The body's arguments with each reference replaced by its value,
        and the references used. ``SecretError`` if one cannot be resolved."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:  # the body's own call reports it
            return args, kwargs, ()
        secrets = ex.runtime.secrets
        access = access_of(ex, what)
        used: list[Secret] = []
        for name in self.names:
            ref = as_ref(bound.arguments.get(name))
            if ref is None:
                continue
            bound.arguments[name] = secrets.resolve(ref, access)
            used.append(ref)
        return bound.args, bound.kwargs, tuple(used)


def access_of(ex: Executing, what: str | None = None) -> Access:
    run = ex.run
    return Access(tenant=run.tenant, run_id=run.run_id, workflow=run.workflow, call=what)


def should_refresh(ex: Executing, exc: Exception, used: tuple[Secret, ...], refreshes: int, *,
                   write: bool) -> bool:
    """Whether the attempt that raised ``exc`` gets its secrets refreshed and
    runs again (see the module docstring)."""
    if refreshes >= MAX_REFRESHES:
        return False
    if isinstance(exc, CredentialExpired):
        return bool(used) or exc.secret is not None
    if write or not used:
        return False
    return ex.runtime.secrets.is_expired(exc, used)


def refresh(ex: Executing, exc: Exception, used: tuple[Secret, ...], refreshes: int, what: str) -> None:
    """Refresh the secrets named by ``exc`` (a ``CredentialExpired`` naming
    one), or every secret the attempt used. A refresh that fails is the
    attempt's failure, as a ``CredentialExpired`` (a definite one: the
    request was refused, and nothing was sent since)."""
    named = exc.secret if isinstance(exc, CredentialExpired) else None
    refs = used
    if named is not None:
        refs = tuple(r for r in used if r.name == named) or (Secret(named),)
    secrets, access = ex.runtime.secrets, access_of(ex, what)
    for ref in refs:
        try:
            secrets.refresh(ref, access)
        except SecretError as failed:
            raise CredentialExpired(f"{redaction.redact(str(exc))}; refreshing {ref} failed: {failed}",
                                    secret=ref.name) from None
    log.info("run %s: %s: %s (%s); refreshed %s and running it again (%d/%d)", ex.run_id, what,
             "credential expired", type(exc).__qualname__, ", ".join(str(r) for r in refs),
             refreshes + 1, MAX_REFRESHES)


__all__ = ["MAX_REFRESHES", "SecretParams", "access_of", "refresh", "should_refresh"]
