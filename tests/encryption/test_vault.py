"""The Vault transit keyring against a local stand-in of its HTTP API: data
keys wrapped by a key that never leaves Vault, bound to tenant and version;
a Vault-side rotation keeps old data keys opening; a wrong token, a moved key
row and an unreachable Vault are one-line errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import cairn
from cairn.errors import ConfigError
from cairn.security.envelope import SealError
from cairn.security.keyring import keyring_from_spec
from cairn.security.vault import VaultTransitKeyring
from tests.encryption.test_sealed_store import CANARY, Raw, build, drive
from tests.encryption.vault_standin import TransitStandIn


@pytest.fixture
def vault() -> Iterator[TransitStandIn]:
    standin = TransitStandIn("s.test-token")
    yield standin
    standin.close()


def test_runs_sealed_with_data_keys_wrapped_in_vault(place: str, vault: TransitStandIn) -> None:
    ring = VaultTransitKeyring(vault.address, "s.test-token", "cairn")
    app = build(place, ring)
    run_id = app.start("canary", f"{CANARY}-v", tenant="a").run_id
    assert drive(app, run_id, "ok") == "completed"
    ((kek, wrapped),) = Raw(place)("SELECT kek_id, wrapped FROM data_keys")
    assert kek == "vault:transit/cairn"
    assert bytes(wrapped).startswith(b"vault:v1:")
    app.close()
    vault.rotate("cairn")  # Vault-side rotation: v2 wraps new data keys, v1's still open
    app = build(place, VaultTransitKeyring(vault.address, "s.test-token", "cairn"))
    assert app.handle(run_id).result(timeout=5)["signal"] == f"{CANARY}-signal"
    other = app.start("canary", "x", tenant="b").run_id
    assert app.store.get_run(other) is not None
    wrapped_b = Raw(place)("SELECT wrapped FROM data_keys WHERE tenant = 'b'")[0][0]
    assert bytes(wrapped_b).startswith(b"vault:v2:")
    app.close()


def test_a_data_key_row_moved_to_another_tenant_does_not_unwrap(place: str, vault: TransitStandIn) -> None:
    app = build(place, VaultTransitKeyring(vault.address, "s.test-token", "cairn"))
    a = app.start("canary", "x", tenant="a").run_id
    app.start("canary", "y", tenant="b")
    app.close()
    raw = Raw(place)
    raw("UPDATE data_keys SET wrapped = (SELECT wrapped FROM data_keys WHERE tenant = 'b') "
        "WHERE tenant = 'a'")
    app = build(place, VaultTransitKeyring(vault.address, "s.test-token", "cairn"))
    with pytest.raises(SealError, match="message authentication failed"):
        app.store.get_run(a)  # a's key row holds b's wrapped key: bound to (b, 1), Vault refuses it
    app.close()


def test_a_wrong_token_or_no_vault_is_a_one_line_error(tmp_path: Path, vault: TransitStandIn,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    app = build(url, VaultTransitKeyring(vault.address, "s.wrong", "cairn"))
    with pytest.raises(ConfigError, match="Vault refused the token") as caught:
        app.start("canary", "x")
    assert "\n" not in str(caught.value)
    assert "s.wrong" not in str(caught.value)
    app.close()
    vault.close()
    app = build(url, VaultTransitKeyring(vault.address, "s.test-token", "cairn"))
    with pytest.raises(ConfigError, match="cannot reach Vault"):
        app.start("canary", "x")
    app.close()
    monkeypatch.setenv("VAULT_ADDR", "http://127.0.0.1:1")
    monkeypatch.setenv("VAULT_TOKEN", "t")
    ring = keyring_from_spec("vault:secrets/transit/cairn")
    assert ring.current() == "vault:secrets/transit/cairn"
    monkeypatch.delenv("VAULT_TOKEN")
    with pytest.raises(ConfigError, match="no Vault token"):
        keyring_from_spec("vault:cairn")
    with pytest.raises(ConfigError, match="not an http"):
        VaultTransitKeyring("file:///etc", "t", "k")
    assert isinstance(cairn.App, type)
