"""Store contract: content-addressed artifacts."""

from __future__ import annotations

import hashlib

import pytest

from cairn.errors import PayloadError
from cairn.store.contract import Store
from tests.store.contract.helpers import (
    ContractBase,
)


class ArtifactsContract(ContractBase):
    # -- artifacts --------------------------------------------------------------------

    def test_artifacts_round_trip(self, store: Store) -> None:
        big = bytes(range(256)) * 4096
        ref = store.put_artifact(big)
        assert store.get_artifact(ref) == big
        assert store.put_artifact(big) == ref
        other = store.put_artifact(b"other")
        assert other != ref
        assert store.get_artifact(other) == b"other"
        empty = store.put_artifact(b"")
        assert store.get_artifact(empty) == b""

    @pytest.mark.parametrize(
        "ref", [hashlib.sha256(b"never stored").hexdigest(), "not-a-ref", "", "../../etc/passwd"]
    )
    def test_unknown_artifact(self, store: Store, ref: str) -> None:
        store.put_artifact(b"something")
        with pytest.raises(PayloadError):
            store.get_artifact(ref)
