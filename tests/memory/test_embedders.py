"""The shipped embedders: the offline hash embedder's properties, and the
OpenAI-compatible client against a real local HTTP server (``FakeOpenAI``)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

import cairn
from cairn.memory.embedders import Embedder, HashEmbedder, OpenAIEmbedder
from cairn.models.openai import ModelRequestError, ModelUnavailable
from cairn.retry import TerminalError
from tests.models.fake_openai import FakeOpenAI, Reply, error, json_reply
from tests.security.world import Service


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_the_hash_embedder_is_deterministic_unit_length_and_near_for_shared_words() -> None:
    emb = HashEmbedder(384)
    assert isinstance(emb, Embedder)
    tea, tea2, bike, empty = emb.embed(["likes green tea", "green tea, please", "rides a bicycle", ""])
    assert emb.embed(["likes green tea"])[0] == tea  # the same bits, in any process
    assert all(len(v) == 384 and math.isclose(cosine(v, v), 1.0) for v in (tea, tea2, bike, empty))
    assert cosine(tea, tea2) > 0.4 > abs(cosine(tea, bike))
    plural, singular, other = emb.embed(["preferences", "preference", "bicycles"])
    assert cosine(plural, singular) > 0.4 > abs(cosine(plural, other))  # trigrams: word forms are near
    assert HashEmbedder(64).name != emb.name  # vectors of other sizes are never compared
    with pytest.raises(ValueError, match="dims"):
        HashEmbedder(2)


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def client(server: FakeOpenAI) -> Iterator[OpenAIEmbedder]:
    emb = OpenAIEmbedder("text-embedding-3-small", 3, base_url=server.url, api_key="sk-secret", timeout=2.0)
    yield emb
    emb.close()


def answer(*vectors: list[float]) -> Reply:
    # out of order on purpose: the client sorts by index
    pairs = reversed(list(enumerate(vectors)))
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in pairs]
    return json_reply({"object": "list", "data": data, "model": "m", "usage": {"prompt_tokens": 3}})


def test_the_openai_embedder_sends_one_request_per_batch_and_orders_the_answer(
    server: FakeOpenAI, client: OpenAIEmbedder
) -> None:
    server.script(answer([1, 0, 0], [0, 1, 0]))
    assert client.embed(["a", "b"]) == [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    [request] = server.requests
    assert (request.path, request.body["input"], request.body["model"]) == (
        "/v1/embeddings", ["a", "b"], "text-embedding-3-small")
    assert request.headers["authorization"] == "Bearer sk-secret"
    assert "sk-secret" not in repr(client)
    assert client.embed([]) == []  # no request for nothing


@pytest.mark.parametrize("reply", [
    error(429, "slow down", **{"retry-after": "2"}), error(503, "overloaded"), error(500, "boom"),
    Reply(drop=True), Reply(delay=5.0)])
def test_transient_failures_are_model_unavailable(
    server: FakeOpenAI, client: OpenAIEmbedder, reply: Reply
) -> None:
    server.script(reply)
    with pytest.raises(ModelUnavailable) as info:
        client.embed(["a"])
    assert "sk-secret" not in str(info.value)
    assert "\n" not in str(info.value)
    if reply.status == 429:
        assert info.value.retry_after == 2.0


@pytest.mark.parametrize(("reply", "match"), [
    (error(400, "input too long"), "HTTP 400: input too long"),
    (error(401, "bad key"), "HTTP 401"),
    (json_reply({"error": {"message": "quota", "code": "insufficient_quota"}}, 429), "HTTP 429"),
    (json_reply({"data": "nope"}), "not an embeddings answer"),
    (Reply(200, b"<html>", {"Content-Type": "text/html"}), "not an embeddings answer"),
    (answer([1, 0, 0]), "1 embeddings for 2 texts"),
    (answer([1, 0], [0, 1]), "2 dimensions, not 3"),
])
def test_permanent_failures_are_terminal(
    server: FakeOpenAI, client: OpenAIEmbedder, reply: Reply, match: str
) -> None:
    server.script(reply)
    with pytest.raises(ModelRequestError, match=match) as info:
        client.embed(["a", "b"])
    assert isinstance(info.value, TerminalError)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="timeout"):
        OpenAIEmbedder("m", 3, timeout=0)
    with pytest.raises(ValueError, match="dims"):
        OpenAIEmbedder("m", 0)


def test_a_secret_key_is_resolved_per_call_refreshed_on_401_and_never_held(server: FakeOpenAI) -> None:
    """The embedding worker runs outside any run, so the resolver is given
    explicitly; the key is a reference, resolved at each request."""
    service = Service()
    resolver = cairn.Secrets(cairn.CallableSecrets(service.issue))
    emb = OpenAIEmbedder("m", 3, base_url=server.url, api_key=cairn.Secret("embeddings"), secrets=resolver)
    server.script(answer([1, 0, 0]), error(401, "expired"), answer([0, 1, 0]))
    try:
        assert emb.embed(["a"]) == [[1.0, 0.0, 0.0]]
        service.revoke_all()
        assert emb.embed(["b"]) == [[0.0, 1.0, 0.0]]
    finally:
        emb.close()
    first, second = service.tokens()
    assert [r.headers.get("authorization") for r in server.requests] == [
        f"Bearer {first}", f"Bearer {first}", f"Bearer {second}"]
    assert first not in repr(vars(emb))
    assert second not in repr(vars(emb))
