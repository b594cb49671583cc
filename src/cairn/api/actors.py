"""Who acts, and how they were authenticated (issue 26 part 1).

Every mutation records an actor: a string whose prefix says what kind of
identity it is, and so how it was authenticated:

=============  ==============================  ================================
prefix         who                             authenticated by
=============  ==============================  ================================
``cli:``       a person at ``cairn`` (OS user)  the OS user of the process
``user:``      a configured identity            ``$CAIRN_ACTOR`` (trusted config)
``http:``      an API token (name#token id)     the bearer token's digest
``app:``       a program through its ``App``    being the process (in-process)
``schedule:``  a schedule's tick                the worker that fired it
``run:``       a parent run (child runs)        the parent's lease
worker         a lease holder's entries         ``worker`` and ``epoch`` columns
=============  ==============================  ================================

A run's ``run.created`` entry also records its **permissions context**
(``started_by``): the actor, how it was authenticated, the tenant, the role
(an API token's) and any delegated scopes an embedding program passes to
``App.start(started_by=...)``. It is part of the entry, so the audit chain
covers it, and ``cairn audit log`` shows it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cairn.errors import InvalidArgument

# in the store's layer, so that a worker records with them too (re-exported here)
from cairn.store.oplog import AUTH as AUTH
from cairn.store.oplog import acting as acting
from cairn.store.oplog import auth_of as auth_of


def context(actor: str, tenant: str, *, role: str | None = None, scopes: Sequence[str] | None = None,
            auth: str | None = None, **extra: Any) -> dict[str, Any]:
    """A run's permissions context, as its ``run.created`` entry records it."""
    found: dict[str, Any] = {"actor": actor, "auth": auth or auth_of(actor), "tenant": tenant}
    if role is not None:
        found["role"] = role
    if scopes is not None:
        found["scopes"] = list(scopes)
    found.update(extra)
    return found


def checked(given: Mapping[str, Any], tenant: str, default_auth: str) -> dict[str, Any]:
    """A permissions context passed by a caller (``App.start(started_by=)``):
    an ``actor`` string and optional ``role``, ``scopes`` (strings) and
    other JSON values; its ``tenant`` is the run's, whatever it says.
    ``auth``: as given (the program passing it has the database's rights
    anyway), else that the program vouched for it."""
    if not isinstance(given, Mapping):
        raise InvalidArgument("started_by must be a mapping with an 'actor'")
    actor = given.get("actor")
    if not isinstance(actor, str) or not actor or len(actor) > 200 \
            or any(ch < " " or "\x7f" <= ch <= "\x9f" for ch in actor):
        raise InvalidArgument("started_by needs an 'actor' of 1 to 200 characters without control characters")
    scopes = given.get("scopes")
    if scopes is not None and (isinstance(scopes, str) or not isinstance(scopes, Sequence)
                               or not all(isinstance(s, str) for s in scopes)):
        raise InvalidArgument("started_by 'scopes' must be a list of strings")
    role = given.get("role")
    if role is not None and not isinstance(role, str):
        raise InvalidArgument("started_by 'role' must be a string")
    auth = given.get("auth")
    if auth is not None and not isinstance(auth, str):
        raise InvalidArgument("started_by 'auth' must be a string")
    extra = {k: v for k, v in given.items() if k not in ("actor", "role", "scopes", "tenant", "auth")}
    vouched = f"{default_auth}, vouched for by the program"
    return context(actor, tenant, role=role, scopes=scopes, auth=auth or vouched, **extra)


