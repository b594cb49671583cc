"""The AWS KMS keyring against a local stand-in of KMS's JSON API: requests
signed with Signature Version 4 (checked against AWS's published example),
data keys wrapped by a KMS key bound to tenant and version, ``cairn keys``
working with it as with a key file; a wrong key, a moved key row, wrong
credentials and an unreachable KMS are one-line errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from cairn.cli.main import main as cli
from cairn.errors import ConfigError
from cairn.security.awskms import AwsKmsKeyring, sign
from cairn.security.envelope import SealError
from cairn.security.keyring import keyring_from_spec
from tests.encryption.kms_standin import KmsStandIn
from tests.encryption.test_sealed_store import CANARY, Raw, build, drive

ACCESS, SECRET = "AKIDCAIRNTEST", "cairn/test+secret"


@pytest.fixture
def kms() -> Iterator[KmsStandIn]:
    standin = KmsStandIn({ACCESS: SECRET})
    standin.create_key("alias/cairn")
    yield standin
    standin.close()


def ring(kms: KmsStandIn, key: str = "alias/cairn", secret: str = SECRET) -> AwsKmsKeyring:
    return AwsKmsKeyring(key, region=kms.region, access_key=ACCESS, secret_key=secret, endpoint=kms.address)


def test_requests_are_signed_as_awss_published_example() -> None:
    """AWS's Signature Version 4 example (IAM ListUsers, 2015-08-30), to the published signature."""
    headers = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8",
               "Host": "iam.amazonaws.com", "X-Amz-Date": "20150830T123600Z"}
    auth = sign("GET", "https://iam.amazonaws.com/?Version=2010-05-08&Action=ListUsers", headers, b"",
                access_key="AKIDEXAMPLE", secret_key="wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
                region="us-east-1", service="iam", amz_date="20150830T123600Z")
    assert auth == ("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, "
                    "SignedHeaders=content-type;host;x-amz-date, "
                    "Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7")


def test_runs_sealed_with_data_keys_wrapped_by_a_kms_key(place: str, kms: KmsStandIn) -> None:
    app = build(place, ring(kms))
    run_id = app.start("canary", f"{CANARY}-kms", tenant="a").run_id
    assert drive(app, run_id, "ok") == "completed"
    ((kek, wrapped),) = Raw(place)("SELECT kek_id, wrapped FROM data_keys")
    assert kek == "aws-kms:alias/cairn"
    assert CANARY.encode() not in bytes(wrapped)
    app.close()
    app = build(place, ring(kms))  # another process: the data key unwrapped by KMS again
    assert app.handle(run_id).result(timeout=5)["signal"] == f"{CANARY}-signal"
    app.close()
    assert {"TrentService.Encrypt", "TrentService.Decrypt"} <= set(kms.calls)


def test_a_moved_key_row_or_a_wrong_key_does_not_unwrap(place: str, kms: KmsStandIn) -> None:
    app = build(place, ring(kms))
    a = app.start("canary", "x", tenant="a").run_id
    app.start("canary", "y", tenant="b")
    app.close()
    raw = Raw(place)
    saved = raw("SELECT wrapped FROM data_keys WHERE tenant = 'a'")[0][0]
    raw("UPDATE data_keys SET wrapped = (SELECT wrapped FROM data_keys WHERE tenant = 'b') "
        "WHERE tenant = 'a'")
    app = build(place, ring(kms))
    with pytest.raises(SealError, match="InvalidCiphertextException") as caught:
        app.store.get_run(a)  # a's row holds b's wrapped key: bound to (b, 1), KMS refuses it
    assert "\n" not in str(caught.value)
    app.close()
    raw("UPDATE data_keys SET wrapped = :w WHERE tenant = 'a'", w=saved)
    kms.create_key("alias/other")
    raw("UPDATE data_keys SET kek_id = :kek WHERE tenant = 'a'", kek="aws-kms:alias/other")  # wrong key
    app = build(place, ring(kms))
    with pytest.raises(SealError, match="IncorrectKeyException"):
        app.store.get_run(a)
    app.close()
    raw("UPDATE data_keys SET kek_id = :kek WHERE tenant = 'a'", kek="aws-kms:alias/gone")
    app = build(place, ring(kms))
    with pytest.raises(SealError, match=r"NotFoundException|IncorrectKeyException"):
        app.store.get_run(a)
    app.close()


def test_wrong_credentials_or_no_kms_are_one_line_errors(tmp_path: Path, kms: KmsStandIn,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    app = build(url, ring(kms, secret="not the secret"))
    with pytest.raises(ConfigError, match=r"refused the credentials.*InvalidSignatureException") as caught:
        app.start("canary", "x")
    assert "\n" not in str(caught.value)
    assert "not the secret" not in str(caught.value)
    app.close()
    for variable in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDSOMEONEELSE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_ENDPOINT_URL_KMS", kms.address)
    with pytest.raises(ConfigError, match="region"):
        keyring_from_spec("aws-kms:alias/cairn")
    arn = f"arn:aws:kms:{kms.region}:111122223333:alias/cairn"
    assert keyring_from_spec(f"aws-kms:{arn}").current() == f"aws-kms:{arn}"  # the region: the ARN's
    monkeypatch.setenv("AWS_REGION", kms.region)
    app = build(url, keyring_from_spec("aws-kms:alias/cairn"))
    with pytest.raises(ConfigError, match="UnrecognizedClientException"):
        app.start("canary", "x")
    app.close()
    kms.close()
    app = build(url, ring(kms))
    with pytest.raises(ConfigError, match="cannot reach AWS KMS"):
        app.start("canary", "x")
    app.close()
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ConfigError, match="no AWS credentials"):
        keyring_from_spec("aws-kms:alias/cairn")
    with pytest.raises(SealError, match="not an AWS KMS key"):
        ring(kms).unwrap("vault:transit/cairn", b"x", b"a\x001")


def test_cairn_keys_with_a_kms_keyring(tmp_path: Path, kms: KmsStandIn,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """status, rotate, reencrypt, verify and a KEK rotation to another KMS key, as with a key file."""
    monkeypatch.setenv("CAIRN_KEYRING", "")
    for variable, value in (("AWS_ACCESS_KEY_ID", ACCESS), ("AWS_SECRET_ACCESS_KEY", SECRET),
                            ("AWS_REGION", kms.region), ("AWS_ENDPOINT_URL_KMS", kms.address)):
        monkeypatch.setenv(variable, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    url = f"sqlite:///{tmp_path}/c.db"
    app = build(url, keyring_from_spec("aws-kms:alias/cairn"))
    run_id = app.start("canary", f"{CANARY}-cli", tenant="a").run_id
    assert drive(app, run_id, "ok") == "completed"
    app.close()
    runner = CliRunner()
    spec, keyring = ["--db", url, "keys"], ["--keyring", "aws-kms:alias/cairn"]
    done = runner.invoke(cli, [*spec, "rotate", *keyring, "--tenant", "a"])
    assert "a: data key v2" in done.output, done.output
    done = runner.invoke(cli, [*spec, "reencrypt", *keyring])
    assert done.exit_code == 0, done.output
    done = runner.invoke(cli, [*spec, "status", *keyring])
    assert "a: newest v2" in done.output, done.output
    assert "; 0 on older keys; artifacts v2: 1; 0 on older keys" in done.output, done.output
    kms.create_key("alias/next")
    done = runner.invoke(cli, [*spec, "rotate", "--kek", "--keyring", "aws-kms:alias/next"])
    assert "rewrapped 2 data keys" in done.output, done.output
    assert {r[0] for r in Raw(url)("SELECT kek_id FROM data_keys")} == {"aws-kms:alias/next"}
    done = runner.invoke(cli, [*spec, "verify", "--keyring", "aws-kms:alias/next"])
    assert done.exit_code == 0, done.output
    assert "a: 1 runs, 1 artifacts, 0 failures" in done.output, done.output
