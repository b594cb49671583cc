"""Unit tests of secret references, values, providers and the resolver
(``cairn.security``): no database, no run."""

from __future__ import annotations

import copy
import logging
import os
import pickle
import threading
from pathlib import Path

import msgspec
import pytest

import cairn
from cairn.codec import values
from cairn.security import redaction
from cairn.security import secrets as security
from cairn.security.secrets import Access, as_ref
from tests.acceptance.harness import FakeClock

TOKEN = "tok-0123456789abcdef"


# -- references ---------------------------------------------------------------------------


def test_a_reference_is_recorded_as_a_tagged_reference_and_decodes_back() -> None:
    ref = cairn.Secret("github", provider="vault", version="7", scope="repo:read")
    data = values.encode({"auth": ref})
    assert msgspec.json.decode(data) == {"auth": {"$cairn": "secret", "name": "github", "provider": "vault",
                                                   "version": "7", "scope": "repo:read"}}
    assert values.decode(data, dict[str, cairn.Secret]) == {"auth": ref}
    assert values.encode(cairn.Secret("x")) == b'{"$cairn":"secret","name":"x"}'
    # a reference decoded as plain JSON (a parameter annotated Any) is still recognised
    assert as_ref(msgspec.json.decode(values.encode(ref))) == ref
    assert as_ref({"name": "x"}) is None
    assert as_ref("x") is None


@pytest.mark.parametrize("name", ["", "  ", "a\nb", "a\x00"])
def test_a_reference_needs_a_plain_name(name: str) -> None:
    with pytest.raises(ValueError, match="secret"):
        cairn.Secret(name)
    with pytest.raises(cairn.PayloadError):
        values.decode(values.encode({"$cairn": "secret", "name": name}), cairn.Secret)


# -- values ---------------------------------------------------------------------------------


def test_a_value_shows_a_mask_everywhere_but_reveal() -> None:
    value = cairn.SecretValue(TOKEN, ref=cairn.Secret("github"))
    shown = [repr(value), str(value), f"{value}", f"{value!r}", f"{value:>40}", f"{value}",
             repr([value]), repr({"k": value})]
    assert all(TOKEN not in text for text in shown), shown
    assert repr(value) == "SecretValue('github', '***')"
    assert value.reveal() == TOKEN
    assert copy.deepcopy({"v": value})["v"] is value
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(value)


def test_the_codec_refuses_a_resolved_value_naming_where_it_is() -> None:
    value = cairn.SecretValue(TOKEN, ref=cairn.Secret("github"))
    with pytest.raises(cairn.SecretLeak, match=r"value\['headers'\]\[1\].*SecretValue 'github'") as err:
        values.encode({"headers": ["x", value]})
    assert TOKEN not in str(err.value)
    assert isinstance(err.value, cairn.PayloadError)


def test_the_codec_refuses_a_resolved_value_inside_a_pydantic_model() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Call(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
        token: cairn.SecretValue

    with pytest.raises(cairn.SecretLeak, match=r"Call.token"):
        values.encode(Call(token=cairn.SecretValue(TOKEN, ref=cairn.Secret("github"))))


def test_a_revealed_value_is_refused_in_any_payload_in_every_form() -> None:
    from cairn.codec.payloads import PayloadCodec

    codec = PayloadCodec(store=None)  # type: ignore[arg-type]  # nothing is offloaded here
    codec.wrap(b'{"token": "' + TOKEN.encode() + b'"}')  # nothing revealed yet: not a secret
    cairn.SecretValue(TOKEN, ref=cairn.Secret("github"))
    import base64
    forms = [TOKEN.encode(), base64.b64encode(TOKEN.encode()), base64.urlsafe_b64encode(TOKEN.encode())]
    for form in forms:
        with pytest.raises(cairn.SecretLeak, match="secret 'github'") as err:
            codec.wrap(b'{"x": "prefix ' + form + b'"}')
        assert TOKEN not in str(err.value)
    quoted = 'a"quote\\and-more'
    cairn.SecretValue(quoted, ref=cairn.Secret("odd"))
    with pytest.raises(cairn.SecretLeak, match="odd"):
        codec.wrap(values.encode({"x": quoted}))  # JSON-escaped
    codec.wrap(b'{"x": "short"}')


def test_short_values_are_not_looked_for() -> None:
    cairn.SecretValue("1234", ref=cairn.Secret("pin"))
    assert not redaction.active()
    assert redaction.redact("pin 1234") == "pin 1234"


def test_redaction_masks_revealed_values_in_text_and_log_records(caplog: pytest.LogCaptureFixture) -> None:
    cairn.SecretValue(TOKEN, ref=cairn.Secret("github"))
    masked = redaction.redact(f"HTTP 401: Authorization: Bearer {TOKEN}")
    assert masked == "HTTP 401: Authorization: Bearer ***"
    logger = logging.getLogger("cairn.test_redaction")
    redaction.protect_loggers()
    with caplog.at_level(logging.INFO, logger="cairn"):
        logger.info("sent %s", TOKEN)
        try:
            raise RuntimeError(f"refused {TOKEN}")
        except RuntimeError:
            logger.exception("it failed: %s", f"token={TOKEN}")
    assert "sent ***" in caplog.text
    assert "token=***" in caplog.text
    assert "refused ***" in caplog.text
    assert TOKEN not in caplog.text


def test_redaction_masks_the_json_escaped_form_of_a_value(caplog: pytest.LogCaptureFixture) -> None:
    """A value with a quote or a backslash is echoed JSON-escaped by an HTTP
    library's error (``{"token": "tok\\"en..."}``): that form is masked too,
    in an error's text and in a log line, and no piece of it is left."""
    value = 'tok"en\\wall-4242'
    cairn.SecretValue(value, ref=cairn.Secret("odd"))
    escaped = values.encode(value).decode()[1:-1]
    assert escaped != value
    body = f'HTTP 401: {{"error": "bad token", "token": "{escaped}"}}'
    assert redaction.redact(body) == 'HTTP 401: {"error": "bad token", "token": "***"}'
    assert redaction.redact(f"raw {value}") == "raw ***"
    logger = logging.getLogger("cairn.test_redaction_escaped")
    redaction.protect_loggers()
    with caplog.at_level(logging.INFO, logger="cairn"):
        logger.info("the server answered %s", body)
    assert '"token": "***"' in caplog.text
    assert escaped not in caplog.text
    assert "wall-4242" not in caplog.text


def test_the_registry_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redaction, "CAPACITY", 3)
    for i in range(5):
        cairn.SecretValue(f"value-number-{i}", ref=cairn.Secret("rotating"))
    assert redaction.redact("value-number-0 value-number-4") == "value-number-0 ***"


# -- providers ----------------------------------------------------------------------------------


def test_env_secrets_read_only_their_prefix_and_per_tenant() -> None:
    environ = {"CAIRN_SECRET_OPENAI_KEY": "sk-1", "CAIRN_DB": "postgresql://u:pw@db/x",
               "CAIRN_SECRET_ACME_OPENAI_KEY": "sk-acme"}
    env = cairn.EnvSecrets(environ=environ)
    assert env.get(cairn.Secret("openai-key"), Access()) == "sk-1"
    with pytest.raises(cairn.SecretNotFound, match="CAIRN_SECRET_DB is not set"):
        env.get(cairn.Secret("db"), Access())  # the rest of the environment is out of reach
    with pytest.raises(cairn.SecretNotFound, match="CAIRN_SECRET____CAIRN_DB is not set"):
        env.get(cairn.Secret("../CAIRN_DB"), Access())
    tenanted = cairn.EnvSecrets(per_tenant=True, environ=environ)
    assert tenanted.get(cairn.Secret("openai-key"), Access(tenant="acme")) == "sk-acme"
    with pytest.raises(cairn.SecretNotFound):
        tenanted.get(cairn.Secret("openai-key"), Access(tenant="globex"))
    with pytest.raises(cairn.SecretNotFound, match="version"):
        env.get(cairn.Secret("openai-key", version="2"), Access())


def test_env_secrets_see_a_changed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    env = cairn.EnvSecrets(prefix="TEST_CAIRN_")
    monkeypatch.setenv("TEST_CAIRN_TOKEN", "first-value")
    assert env.get(cairn.Secret("token"), Access()) == "first-value"
    monkeypatch.setenv("TEST_CAIRN_TOKEN", "second-value")
    assert env.refresh(cairn.Secret("token"), Access()) == "second-value"
    assert "TEST_CAIRN_TOKEN" in os.environ


def test_file_secrets_read_a_mount_and_stay_inside_it(tmp_path: Path) -> None:
    mount = tmp_path / "secrets"
    mount.mkdir()
    (mount / "api-token").write_text(TOKEN + "\n")
    (tmp_path / "outside").write_text("not yours")
    (mount / "acme").mkdir()
    (mount / "acme" / "api-token").write_text("acme-token-value")
    files = cairn.FileSecrets(mount)
    assert files.get(cairn.Secret("api-token"), Access()) == TOKEN  # the trailing newline dropped
    assert cairn.FileSecrets(mount, strip=False).get(cairn.Secret("api-token"), Access()) == TOKEN + "\n"
    for name in ["../outside", "/etc/passwd", ".hidden", "..data", "a/b"]:
        with pytest.raises(cairn.SecretNotFound, match="plain file name"):
            files.get(cairn.Secret(name), Access())
    with pytest.raises(cairn.SecretNotFound, match="no file"):
        files.get(cairn.Secret("missing"), Access())
    tenanted = cairn.FileSecrets(mount, per_tenant=True)
    assert tenanted.get(cairn.Secret("api-token"), Access(tenant="acme")) == "acme-token-value"
    with pytest.raises(cairn.SecretNotFound, match="plain file name"):
        tenanted.get(cairn.Secret("api-token"), Access(tenant="../acme"))
    (mount / "api-token").write_text("rotated-in-place")  # Kubernetes updates a mounted secret
    assert files.refresh(cairn.Secret("api-token"), Access()) == "rotated-in-place"
    (mount / "binary").write_bytes(b"\xff\xfe")
    with pytest.raises(cairn.SecretError, match="not UTF-8"):
        files.get(cairn.Secret("binary"), Access())


def test_callable_secrets_cache_until_expiry_and_refresh() -> None:
    clock = FakeClock(1000.0)
    issued: list[str] = []

    def fetch(ref: cairn.Secret, access: Access) -> tuple[str, float]:
        issued.append(f"fetch-{len(issued)}-{access.tenant}-{ref.scope}")
        return issued[-1], clock() + 3600

    def refresh(ref: cairn.Secret, access: Access) -> tuple[str, float]:
        issued.append(f"refresh-{len(issued)}-{access.tenant}")
        return issued[-1], clock() + 3600

    provider = cairn.CallableSecrets(fetch, refresh, clock=clock, leeway=60)
    ref = cairn.Secret("idp", scope="payments")
    first = provider.get(ref, Access(tenant="acme"))
    assert isinstance(first, cairn.SecretValue)
    assert first.reveal() == "fetch-0-acme-payments"
    assert provider.get(ref, Access(tenant="acme")) is first  # cached
    assert provider.get(ref, Access(tenant="globex")) is not first  # per tenant
    clock.advance(3600 - 59)  # within the leeway of its expiry: refreshed before use
    renewed = provider.get(ref, Access(tenant="acme"))
    assert isinstance(renewed, cairn.SecretValue)
    assert renewed.reveal() == "refresh-2-acme"
    forced = provider.refresh(ref, Access(tenant="acme"))
    assert isinstance(forced, cairn.SecretValue)
    assert forced.reveal() == "refresh-3-acme"
    assert provider.get(ref, Access(tenant="acme")) is forced


def test_callable_secrets_refresh_once_for_many_threads() -> None:
    started, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def slow(ref: cairn.Secret, access: Access) -> str:
        calls.append(1)
        started.set()
        assert release.wait(5)
        return "the-one-token"

    provider = cairn.CallableSecrets(slow)
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(provider.get(cairn.Secret("x"), Access())))
               for _ in range(4)]
    for t in threads:
        t.start()
    assert started.wait(5)
    release.set()
    for t in threads:
        t.join(5)
    assert len(calls) == 1
    assert len(results) == 4


def test_the_resolver_routes_by_provider_and_checks_the_policy(tmp_path: Path) -> None:
    (tmp_path / "db").write_text("file-password")
    resolver = cairn.Secrets(
        {"env": cairn.EnvSecrets(environ={"CAIRN_SECRET_DB": "env-password"}),
         "files": cairn.FileSecrets(tmp_path)},
        allow=lambda ref, access: access.tenant != "mallory",
    )
    assert resolver.resolve(cairn.Secret("db")).reveal() == "env-password"  # the first is the default
    assert resolver.resolve(cairn.Secret("db", provider="files")).reveal() == "file-password"
    with pytest.raises(cairn.SecretNotFound, match=r"no secret provider 'vault'.*env, files"):
        resolver.resolve(cairn.Secret("db", provider="vault"))
    with pytest.raises(cairn.SecretError, match="not available to tenant 'mallory'"):
        resolver.resolve(cairn.Secret("db"), Access(tenant="mallory"))
    resolver.add("vault", cairn.CallableSecrets(lambda ref, access: "vault-password"), default=True)
    assert resolver.resolve(cairn.Secret("db")).reveal() == "vault-password"
    with pytest.raises(TypeError, match="get"):
        resolver.add("bad", object())  # type: ignore[arg-type]


def test_the_resolver_refreshes_an_expired_value_and_wraps_provider_failures() -> None:
    clock = FakeClock(0.0)
    answers = iter([("stale-token-1", -1.0), ("fresh-token-2", 100.0)])
    flaky = cairn.CallableSecrets(lambda ref, access: next(answers), cache=False, clock=clock)
    resolver = cairn.Secrets(flaky, clock=clock, leeway=0)
    assert resolver.resolve(cairn.Secret("t")).reveal() == "fresh-token-2"

    def down(ref: cairn.Secret, access: Access) -> str:
        raise ConnectionError("vault at 10.0.0.1 refused: token=fresh-token-2")

    resolver = cairn.Secrets(cairn.CallableSecrets(down))
    with pytest.raises(cairn.SecretError, match=r"provider failed: ConnectionError: .*token=\*\*\*") as err:
        resolver.resolve(cairn.Secret("t"))
    assert "fresh-token-2" not in str(err.value)
    always_stale = cairn.Secrets(cairn.CallableSecrets(lambda r, a: ("old-old-old", -5.0), cache=False),
                                 clock=clock)
    with pytest.raises(cairn.SecretError, match="even after a refresh"):
        always_stale.resolve(cairn.Secret("t"))
    bad = cairn.Secrets(cairn.CallableSecrets(lambda r, a: 42))  # type: ignore[arg-type,return-value]
    with pytest.raises(cairn.SecretError, match="answered a int"):
        bad.resolve(cairn.Secret("t"))


def test_resolving_outside_a_run_needs_a_resolver() -> None:
    with pytest.raises(cairn.SecretError, match="only be resolved inside a run"):
        security.resolve(cairn.Secret("x"))
    resolver = cairn.Secrets(cairn.CallableSecrets(lambda r, a: "explicit-value"))
    assert security.resolve(cairn.Secret("x"), resolver).reveal() == "explicit-value"


def test_the_default_resolver_reads_cairn_secret_variables_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_SECRET_OPENAI", "sk-from-env")
    monkeypatch.setenv("HOME_TOKEN", "not-a-secret-of-cairn")
    resolver = cairn.Secrets()
    assert resolver.resolve(cairn.Secret("openai")).reveal() == "sk-from-env"
    with pytest.raises(cairn.SecretNotFound):
        resolver.resolve(cairn.Secret("HOME_TOKEN"))


def test_a_value_cannot_be_a_workflow_input_or_a_step_result() -> None:
    app = cairn.App(db="memory://")
    try:
        with pytest.raises(TypeError, match=r"parameter 'token' is annotated SecretValue.*cairn.Secret"):
            @app.workflow(name="bad")
            def bad(ctx: cairn.Context, token: cairn.SecretValue) -> None:
                return None

        with pytest.raises(TypeError, match="return a SecretValue"):
            @app.step()
            def give() -> cairn.SecretValue:
                raise AssertionError("never called")

        @app.workflow(name="good")  # a reference, resolved by the steps that use it
        def good(ctx: cairn.Context, token: cairn.Secret, backup: cairn.Secret | None = None) -> None:
            return None
    finally:
        app.close()


def test_an_async_provider_function_is_refused_clearly() -> None:
    async def fetch(ref: cairn.Secret, access: Access) -> str:
        return "never"

    resolver = cairn.Secrets(cairn.CallableSecrets(fetch))  # type: ignore[arg-type]
    with pytest.raises(cairn.SecretError, match="the provider is async"):
        resolver.resolve(cairn.Secret("x"))
