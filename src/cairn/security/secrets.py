"""Secrets as references: resolved where they are used, never recorded.

A run that waits a day for an approval outlives the access token it started
with, and a journal that recorded the token would hand it to anyone who can
read the database. So a workflow passes ``Secret("github")``, a *reference*
(name, and optionally provider, version and scope), through its arguments,
steps, tools and model clients; the journal records only the reference. The
value is fetched from a provider at the moment of use, on every attempt
and on whichever worker runs it, so a token refreshed meanwhile is the one
used.

* ``Secret`` is a msgspec Struct tagged ``{"$cairn": "secret", ...}``: the
  codec writes it like any value, and it decodes back into a ``Secret``
  wherever the code annotates one.
* ``SecretValue`` wraps a resolved value. Its ``repr``, ``str`` and format
  show a mask (an accidental ``print``, f-string or log line shows
  ``SecretValue('github', '***')``); ``reveal()`` is the one way to the
  text. The codec refuses it (``SecretLeak``), and it cannot be pickled.
* ``SecretProvider`` is the protocol a source of secrets implements:
  ``get(ref, access)`` and ``refresh(ref, access)``. ``EnvSecrets``,
  ``FileSecrets`` (a directory of files: Kubernetes and Docker secret
  mounts) and ``CallableSecrets`` (your function: a vault client, an OAuth
  refresh) are provided.
* ``Secrets`` resolves references for an ``App`` (``cairn.App(secrets=...)``):
  several providers by name, a default one, an optional ``allow`` policy,
  and expiry (a value past its ``expires_at`` is refreshed before use).

References are data: one can arrive in a workflow's input from whoever may
start runs. ``Access`` tells a provider and the ``allow`` policy who is
asking (tenant, run, workflow, call), and ``EnvSecrets``/``FileSecrets``
can keep each tenant to its own secrets (``per_tenant=True``). The default
provider reads only environment variables named ``CAIRN_SECRET_*``, never
the rest of the worker's environment.

This module imports nothing of Cairn's but ``errors`` and ``redaction``:
the codec (below the engine) must know ``Secret`` and ``SecretValue``, and a
model client (below the engine too) must be able to resolve one.
"""

from __future__ import annotations

import contextvars
import inspect
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Protocol, runtime_checkable

import msgspec

from cairn.errors import CredentialExpired, SecretError, SecretNotFound
from cairn.security import redaction

#: The field and value that tag a reference in JSON: ``{"$cairn": "secret", "name": ...}``.
TAG_FIELD, TAG = "$cairn", "secret"


class Secret(msgspec.Struct, frozen=True, omit_defaults=True, tag_field=TAG_FIELD, tag=TAG):
    """A reference to a secret: what the journal records instead of its value.

    ``name`` says which secret; ``provider`` which registered provider holds
    it (default: the resolver's default provider); ``version`` pins a
    version, for providers that keep several (a vault's KV version);
    ``scope`` says what the credential is for (an OAuth scope or audience),
    for providers that mint delegated tokens. All four are passed to the
    provider as they are; none of them is secret.
    """

    name: str
    provider: str | None = None
    version: str | None = None
    scope: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError("a secret's name must be a non-empty string")
        for field in (self.name, self.provider, self.version, self.scope):
            if field is not None and any(ord(c) < 32 or ord(c) == 127 for c in field):
                raise ValueError("a secret reference may not contain control characters")

    def __str__(self) -> str:
        return f"secret {self.name!r}" + (f" of provider {self.provider!r}" if self.provider else "")


def as_ref(value: Any) -> Secret | None:
    """``value`` as a reference: a ``Secret``, or its JSON form (a dict
    tagged ``$cairn: secret``, what a parameter annotated ``Any`` decodes
    it to); ``None`` for anything else."""
    if isinstance(value, Secret):
        return value
    if isinstance(value, dict) and value.get(TAG_FIELD) == TAG:
        try:
            ref: Secret = msgspec.convert(value, Secret)
        except msgspec.ValidationError:
            return None
        return ref
    return None


class SecretValue:
    """A resolved secret. Shows a mask everywhere but ``reveal()``.

    ``ref`` is the reference it was resolved from, ``expires_at`` (epoch
    seconds, or ``None``) when the provider said it stops working. The value
    is registered as revealed (``cairn.security.redaction``), so that it is
    refused if it ever reaches a record and masked in Cairn's error messages
    and log lines."""

    __slots__ = ("_value", "expires_at", "ref")

    def __init__(self, value: str, *, ref: Secret | None = None, expires_at: float | None = None) -> None:
        if not isinstance(value, str):
            raise TypeError(f"a secret's value must be a str, not {type(value).__name__}")
        self._value = value
        self.ref = ref
        self.expires_at = expires_at
        redaction.remember(value, ref.name if ref is not None else "(unnamed)")

    def reveal(self) -> str:
        """The secret's text: pass it to the client that needs it, and nowhere else.
        (The running execution then looks for it in whatever it records.)"""
        self.note()
        return self._value

    def note(self) -> None:
        """Mark the value as used by the running execution (resolving does)."""
        redaction.note(self._value, self.ref.name if self.ref is not None else "(unnamed)")

    def expired(self, now: float | None = None, leeway: float = 0.0) -> bool:
        """Whether the value is past (or within ``leeway`` seconds of) its expiry."""
        if self.expires_at is None:
            return False
        return (time.time() if now is None else now) >= self.expires_at - leeway

    def __repr__(self) -> str:
        name = self.ref.name if self.ref is not None else None
        return f"SecretValue({name!r}, {redaction.MASK!r})"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        raise TypeError("a SecretValue cannot be pickled: pass the cairn.Secret reference instead")

    def __copy__(self) -> SecretValue:
        return self

    def __deepcopy__(self, memo: Any) -> SecretValue:
        return self


@dataclass(frozen=True, slots=True)
class Access:
    """Who asks for a secret: the run's tenant, the run, its workflow, and
    the call about to use it (``"tool 'pay'"``; ``None`` for a model client
    resolving its key). For providers and ``allow`` policies."""

    tenant: str = "default"
    run_id: str | None = None
    workflow: str | None = None
    call: str | None = None


#: What a provider's function may answer: the value, a ``SecretValue``, or
#: ``(value, expires_at)``.
Fetched = SecretValue | str | tuple[str, float | None]


@runtime_checkable
class SecretProvider(Protocol):
    """A source of secrets.

    ``get`` answers the current value (a provider may cache); ``refresh``
    answers a new one, bypassing any cache (an OAuth refresh, a re-read of a
    rotated file). Both raise ``SecretNotFound`` for a secret they do not
    hold. A provider may also define ``is_expired(exc) -> bool`` to say
    that an exception raised by a step or tool body means its credential
    expired (an ``httpx.HTTPStatusError`` with status 401, say): then the
    runtime refreshes and retries as for ``cairn.CredentialExpired``
    (except for ``write`` tools, which must raise ``CredentialExpired``
    themselves: only they know the effect did not happen)."""

    def get(self, ref: Secret, access: Access) -> Fetched: ...

    def refresh(self, ref: Secret, access: Access) -> Fetched: ...


def _normalized(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", text).upper()


def _no_version(provider: str, ref: Secret) -> None:
    if ref.version is not None:
        raise SecretNotFound(f"{ref}: {provider} keeps one version of each secret; "
                             f"version {ref.version!r} cannot be honoured")


class EnvSecrets:
    """Secrets from environment variables: ``Secret("openai")`` reads
    ``$CAIRN_SECRET_OPENAI`` (the prefix, then the name upper-cased with
    every character other than a letter or digit made ``_``).

    Only variables under ``prefix`` are reachable, so a reference that
    arrives in a run's input cannot read the rest of the worker's
    environment (its database URL, say). With ``per_tenant=True`` the
    tenant comes after the prefix (``CAIRN_SECRET_ACME_OPENAI``): a run can
    reach only its own tenant's secrets. ``refresh`` reads the variable again."""

    def __init__(self, prefix: str = "CAIRN_SECRET_", *, per_tenant: bool = False,
                 environ: Mapping[str, str] | None = None) -> None:
        self.prefix = prefix
        self.per_tenant = per_tenant
        self._environ = os.environ if environ is None else environ

    def variable(self, ref: Secret, access: Access) -> str:
        tenant = f"{_normalized(access.tenant)}_" if self.per_tenant else ""
        return f"{self.prefix}{tenant}{_normalized(ref.name)}"

    def get(self, ref: Secret, access: Access) -> Fetched:
        _no_version("EnvSecrets", ref)
        variable = self.variable(ref, access)
        value = self._environ.get(variable)
        if value is None:
            raise SecretNotFound(f"{ref}: the environment variable {variable} is not set")
        return value

    refresh = get

    def __repr__(self) -> str:
        return f"EnvSecrets(prefix={self.prefix!r}, per_tenant={self.per_tenant})"


#: A secret's file name: no path separators, no leading dot (no ``..``, no
#: Kubernetes ``..data``), so a reference cannot leave the directory.
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")


class FileSecrets:
    """Secrets as files in a directory, one file per secret, named after it:
    a Kubernetes secret volume (``/var/run/secrets/NAME``), Docker's
    ``/run/secrets``. Read on every use, so a secret rotated in place (as
    Kubernetes updates a mounted secret) is picked up without a restart; a
    trailing newline is dropped (``strip=False`` keeps it).

    Names must be plain file names (letters, digits, ``.``, ``_``, ``-``,
    not starting with a dot): a reference cannot reach outside the
    directory. ``per_tenant=True`` reads ``DIRECTORY/TENANT/NAME``."""

    def __init__(self, directory: str | os.PathLike[str], *, per_tenant: bool = False,
                 strip: bool = True) -> None:
        self.directory = Path(directory)
        self.per_tenant = per_tenant
        self.strip = strip

    def path(self, ref: Secret, access: Access) -> Path:
        parts = [access.tenant, ref.name] if self.per_tenant else [ref.name]
        for part in parts:
            if not _FILE_NAME.fullmatch(part):
                raise SecretNotFound(f"{ref}: {part!r} is not a plain file name; FileSecrets reads only "
                                     "files directly in its directory")
        return self.directory.joinpath(*parts)

    def get(self, ref: Secret, access: Access) -> Fetched:
        _no_version("FileSecrets", ref)
        path = self.path(ref, access)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise SecretNotFound(f"{ref}: no file {path}") from None
        except OSError as exc:
            raise SecretError(f"{ref}: cannot read {path}: {exc.strerror or exc}") from None
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise SecretError(f"{ref}: {path} is not UTF-8 text") from None
        if self.strip:
            text = text.removesuffix("\n").removesuffix("\r")
        return text

    refresh = get

    def __repr__(self) -> str:
        return f"FileSecrets({str(self.directory)!r}, per_tenant={self.per_tenant})"


class CallableSecrets:
    """Secrets from your own functions: ``fetch(ref, access)`` answers the
    value (a str, a ``SecretValue``, or ``(value, expires_at)``), and
    ``refresh(ref, access)`` a new one (an OAuth refresh-token grant; by
    default ``fetch`` is asked again).

    Answers are cached per (reference, tenant) until ``leeway`` seconds
    before their expiry (for ever without one, unless ``ttl`` gives values
    without an expiry one), so a vault is not asked on every step; a value
    that is about to expire is refreshed before use, and ``refresh`` (which
    the runtime calls when a body raises ``CredentialExpired``) replaces the
    cached one. One refresh per key at a time: calls that find a refresh
    under way wait for its answer instead of refreshing again.

    ``is_expired(exc)`` classifies a body's exception as an expired
    credential (see ``SecretProvider``). ``clock`` is for tests."""

    def __init__(
        self,
        fetch: Callable[[Secret, Access], Fetched],
        refresh: Callable[[Secret, Access], Fetched] | None = None,
        *,
        is_expired: Callable[[BaseException], bool] | None = None,
        cache: bool = True,
        ttl: float | None = None,
        leeway: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._fetch = fetch
        self._refresh = refresh
        self._is_expired = is_expired
        self.cache = cache
        self.ttl = ttl
        self.leeway = leeway
        self.clock = clock
        self._values: dict[tuple[Secret, str], SecretValue] = {}
        self._locks: dict[tuple[Secret, str], threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, ref: Secret, access: Access) -> Fetched:
        key = (ref, access.tenant)
        with self._lock_of(key):
            cached = self._values.get(key)
            if cached is not None and not cached.expired(self.clock(), self.leeway):
                return cached
            if cached is not None and self._refresh is not None:
                return self._store(key, ref, self._refresh(ref, access))
            return self._store(key, ref, self._fetch(ref, access))

    def refresh(self, ref: Secret, access: Access) -> Fetched:
        key = (ref, access.tenant)
        with self._lock_of(key):
            produce = self._refresh or self._fetch
            return self._store(key, ref, produce(ref, access))

    def is_expired(self, exc: BaseException) -> bool:
        return self._is_expired is not None and bool(self._is_expired(exc))

    def _store(self, key: tuple[Secret, str], ref: Secret, fetched: Fetched) -> SecretValue:
        value = as_value(fetched, ref)
        if value.expires_at is None and self.ttl is not None:
            value = SecretValue(value.reveal(), ref=ref, expires_at=self.clock() + self.ttl)
        if self.cache:
            self._values[key] = value
        return value

    def _lock_of(self, key: tuple[Secret, str]) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def __repr__(self) -> str:
        return f"CallableSecrets({getattr(self._fetch, '__qualname__', self._fetch)!r})"


def as_value(fetched: Any, ref: Secret) -> SecretValue:
    """A provider's answer as a ``SecretValue`` of ``ref``."""
    if isinstance(fetched, SecretValue):
        if fetched.ref == ref:
            return fetched
        return SecretValue(fetched.reveal(), ref=ref, expires_at=fetched.expires_at)
    if isinstance(fetched, str):
        return SecretValue(fetched, ref=ref)
    if (isinstance(fetched, tuple) and len(fetched) == 2 and isinstance(fetched[0], str)
            and (fetched[1] is None or isinstance(fetched[1], int | float))):
        return SecretValue(fetched[0], ref=ref, expires_at=None if fetched[1] is None else float(fetched[1]))
    if inspect.iscoroutine(fetched):
        fetched.close()  # never awaited: no warning
        raise SecretError(f"{ref}: the provider is async; providers are called synchronously (a secret is "
                          "resolved just before a body runs): give a sync function, and cache its answers")
    raise SecretError(f"{ref}: the provider answered a {type(fetched).__name__}, not a str, a SecretValue "
                      "or (value, expires_at)")


#: The resolver and identity of the run executing in this context (set by
#: the engine for the length of an execution), for code below the engine
#: that resolves secrets itself: a model client's ``api_key=Secret(...)``.
_AMBIENT: contextvars.ContextVar[tuple[Secrets, Access]] = contextvars.ContextVar("cairn_secrets")


class Secrets:
    """Resolves ``Secret`` references: several providers by name.

    ``providers`` is one provider (registered as ``"default"``), a mapping
    of names to providers, or ``None``: then ``{"env": EnvSecrets()}``
    (``$CAIRN_SECRET_*`` only). ``default`` names the provider of references
    that name none (default: the first). ``allow(ref, access)`` may refuse a
    reference for whoever asks (``SecretError``: a tenant's run asking for
    another tenant's credential). A value past its expiry (within ``leeway``
    seconds) is refreshed before it is handed out.
    """

    def __init__(
        self,
        providers: SecretProvider | Mapping[str, SecretProvider] | None = None,
        *,
        default: str | None = None,
        allow: Callable[[Secret, Access], bool] | None = None,
        leeway: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if providers is None:
            providers = {"env": EnvSecrets()}
        elif not isinstance(providers, Mapping):
            providers = {"default": providers}
        self._providers: dict[str, SecretProvider] = {}
        for name, provider in providers.items():
            self.add(name, provider)
        if default is not None and default not in self._providers:
            raise ValueError(f"default provider {default!r} is not among {sorted(self._providers)}")
        self.default = default if default is not None else next(iter(self._providers), None)
        self.allow = allow
        self.leeway = leeway
        self.clock = clock

    @classmethod
    def coerce(cls, value: Secrets | SecretProvider | Mapping[str, SecretProvider] | None) -> Secrets:
        """What ``App(secrets=...)`` takes, as a resolver."""
        return value if isinstance(value, Secrets) else cls(value)

    def add(self, name: str, provider: SecretProvider, *, default: bool = False) -> None:
        """Register ``provider`` under ``name`` (replacing one of that name)."""
        if not isinstance(name, str) or not name:
            raise ValueError("a provider's name must be a non-empty string")
        if not (callable(getattr(provider, "get", None)) and callable(getattr(provider, "refresh", None))):
            raise TypeError(f"provider {name!r} must have get(ref, access) and refresh(ref, access) methods")
        self._providers[name] = provider
        if default or getattr(self, "default", None) is None:
            self.default = name

    @property
    def providers(self) -> dict[str, SecretProvider]:
        return dict(self._providers)

    def provider_of(self, ref: Secret) -> SecretProvider:
        name = ref.provider or self.default
        provider = self._providers.get(name) if name is not None else None
        if provider is None:
            known = ", ".join(sorted(self._providers)) or "none"
            raise SecretNotFound(f"{ref}: no secret provider {name!r} (registered: {known})")
        return provider

    def resolve(self, ref: Secret, access: Access | None = None) -> SecretValue:
        """The value of ``ref`` for ``access``, refreshed first if it has expired."""
        access = access or Access()
        provider = self._allowed(ref, access)
        value = self._ask(provider.get, ref, access)
        if value.expired(self.clock(), self.leeway):
            value = self._ask(provider.refresh, ref, access)
            if value.expired(self.clock()):
                raise SecretError(f"{ref}: the provider handed out a value that expired at "
                                  f"{value.expires_at}, even after a refresh")
        return value

    def refresh(self, ref: Secret, access: Access | None = None) -> SecretValue:
        """A new value of ``ref`` (the old one was refused as expired)."""
        access = access or Access()
        return self._ask(self._allowed(ref, access).refresh, ref, access)

    def is_expired(self, exc: BaseException, refs: tuple[Secret, ...]) -> bool:
        """Whether ``exc`` says a credential expired: ``CredentialExpired``,
        or an exception a provider of ``refs`` classifies as such."""
        if isinstance(exc, CredentialExpired):
            return True
        for ref in refs:
            try:
                classify = getattr(self.provider_of(ref), "is_expired", None)
                if classify is not None and classify(exc):
                    return True
            except Exception:  # a classifier that fails classifies nothing
                continue
        return False

    def _allowed(self, ref: Secret, access: Access) -> SecretProvider:
        provider = self.provider_of(ref)
        if self.allow is not None and not self.allow(ref, access):
            raise SecretError(f"{ref} is not available to tenant {access.tenant!r}"
                              + (f" ({access.call})" if access.call else ""))
        return provider

    def _ask(self, method: Callable[[Secret, Access], Fetched], ref: Secret, access: Access) -> SecretValue:
        try:
            fetched = method(ref, access)
        except SecretError:
            raise
        except Exception as exc:  # a vault that is down, a refresh grant refused
            message = redaction.redact(str(exc))
            raise SecretError(f"{ref}: its provider failed: {type(exc).__qualname__}: {message}") from None
        value = as_value(fetched, ref)
        value.note()  # a cached value may have been made in another execution
        return value

    def __repr__(self) -> str:
        return f"Secrets({sorted(self._providers)}, default={self.default!r})"


# -- the resolver of the run executing here -------------------------------------------


def bind(resolver: Secrets, access: Access) -> contextvars.Token[tuple[Secrets, Access]]:
    """Make ``resolver`` the one of this context (the engine does, per execution)."""
    return _AMBIENT.set((resolver, access))


def unbind(token: contextvars.Token[tuple[Secrets, Access]]) -> None:
    _AMBIENT.reset(token)


def ambient(resolver: Secrets | None = None) -> tuple[Secrets, Access]:
    """``resolver`` (with a neutral ``Access``), or the resolver of the run
    executing in this context; ``SecretError`` outside a run without one."""
    if resolver is not None:
        bound = _AMBIENT.get(None)
        return resolver, bound[1] if bound is not None else Access()
    bound = _AMBIENT.get(None)
    if bound is None:
        raise SecretError("a cairn.Secret can only be resolved inside a run (where the App's secrets= "
                          "resolve it), or with an explicit resolver (secrets=...)")
    return bound


def resolve(ref: Secret, resolver: Secrets | None = None) -> SecretValue:
    """The value of ``ref`` from ``resolver`` or the running App's resolver."""
    secrets, access = ambient(resolver)
    return secrets.resolve(ref, access)


def refresh(ref: Secret, resolver: Secrets | None = None) -> SecretValue:
    """A new value of ``ref`` (see ``resolve``)."""
    secrets, access = ambient(resolver)
    return secrets.refresh(ref, access)


__all__ = [
    "Access",
    "CallableSecrets",
    "EnvSecrets",
    "Fetched",
    "FileSecrets",
    "Secret",
    "SecretProvider",
    "SecretValue",
    "Secrets",
    "as_ref",
    "as_value",
    "bind",
    "refresh",
    "resolve",
    "unbind",
]
