"""Embedders: text to vectors, for semantic search over long-term memory.

An embedder is anything with a ``name``, a ``dims`` and ``embed(texts)``
(``Embedder``). The name is stored with every vector, so vectors of two
embedders (or two versions of one) are never compared with each other: a
search with embedder A finds only vectors A made.

Two ship with Cairn:

* ``HashEmbedder``: deterministic, offline, free, for tests, the demo and
  any deployment that wants keyword-ish recall without a model. Each text
  becomes a bag of features, its lower-cased words and the character
  trigrams of each word (with boundary marks), each hashed into one of
  ``dims`` buckets with a hashed sign (the "hashing trick"), weighted by
  ``1 + log(count)`` and L2-normalised. Why this choice: texts that share
  words share buckets with the same sign, so their cosine is high; texts
  that share no word are near-orthogonal in expectation (the signs cancel);
  trigrams make "preference" and "preferences" near too. It needs no
  vocabulary, no training and no state, so every process embeds a text to
  the same bits, which the crash tests rely on. It is no language model:
  synonyms are not near.
* ``OpenAIEmbedder``: any OpenAI-compatible ``POST /v1/embeddings``
  endpoint (OpenAI, a local server), over httpx (the ``openai`` extra).
  Its errors are classified the way ``cairn.models.openai`` classifies a
  chat model's: ``ModelUnavailable`` (429, 5xx, timeouts, network: worth
  retrying) and ``ModelRequestError`` (any other refusal or a malformed
  answer: sending the same texts again would fail the same way).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import msgspec

from cairn.errors import MissingExtra
from cairn.models.errors import ModelRequestError, ModelUnavailable, error_message, retry_after
from cairn.security import secrets as security
from cairn.security.secrets import Secret, Secrets

if TYPE_CHECKING:
    import httpx


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors of ``dims`` floats, one per text, in order."""

    #: stored with each vector: vectors of different names are never compared
    name: str
    dims: int

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text. Raises ``ModelUnavailable`` when trying again
        later may work, any other exception when it would not."""
        ...


_WORD = re.compile(r"\w+", re.UNICODE)
#: a word counts this much more than each of its trigrams
_TRIGRAM_WEIGHT = 0.35


class HashEmbedder:
    """Deterministic hashed word and character-trigram features (see the module doc)."""

    def __init__(self, dims: int = 384) -> None:
        if dims < 8:
            raise ValueError(f"dims must be at least 8, not {dims}")
        self.dims = dims
        self.name = f"cairn-hash-v1-{dims}"

    def __repr__(self) -> str:
        return f"HashEmbedder(dims={self.dims})"

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [self._one(text) for text in texts]

    def _one(self, text: str) -> list[float]:
        words = _WORD.findall(text.lower())
        features: Counter[str] = Counter()
        for word in words:
            features["w:" + word] += 1
            marked = f"<{word}>"
            for i in range(len(marked) - 2):
                features["t:" + marked[i:i + 3]] += 1
        if not features:
            features["empty"] = 1  # every empty text is the same unit vector, not a zero one
        vector = [0.0] * self.dims
        for feature, count in features.items():
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "little") % self.dims
            sign = 1.0 if digest[4] & 1 else -1.0
            weight = (1.0 + math.log(count)) * (1.0 if feature[0] == "w" else _TRIGRAM_WEIGHT)
            vector[bucket] += sign * weight
        norm = math.sqrt(sum(x * x for x in vector)) or 1.0
        return [x / norm for x in vector]


class OpenAIEmbedder:
    """An OpenAI-compatible embeddings endpoint.

    ``base_url`` is the API root (``https://api.openai.com/v1``; a local
    server's ``http://127.0.0.1:8080/v1``); requests go to
    ``{base_url}/embeddings``. ``dims`` must be what the model returns (it is
    checked on every answer; ``send_dimensions=True`` also asks the server
    for it, for models that can shorten their vectors). ``timeout`` bounds
    each request as a whole. ``api_key=cairn.Secret("openai")`` keeps no
    key in the object: it is resolved on each call (``secrets``: the
    resolver, default environment variables) and refreshed once on a 401,
    as the chat client does.
    """

    def __init__(
        self, model: str, dims: int, *, base_url: str = "https://api.openai.com/v1",
        api_key: str | Secret | None = None, timeout: float = 30.0, send_dimensions: bool = False,
        name: str | None = None, secrets: Secrets | None = None,
    ) -> None:
        try:
            import httpx
        except ImportError as exc:
            raise MissingExtra("OpenAIEmbedder", "openai") from exc
        if dims < 1:
            raise ValueError(f"dims must be positive, not {dims}")
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        self.model = model
        self.dims = dims
        self.name = name or f"openai:{model}:{dims}"
        self.url = base_url.rstrip("/") + "/embeddings"
        self.timeout = timeout
        self.send_dimensions = send_dimensions
        headers = {"content-type": "application/json"}
        #: a reference resolved at each call (never a value kept here)
        self._key_ref = api_key if isinstance(api_key, Secret) else None
        self._secrets = secrets
        if isinstance(api_key, str) and api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout))
        self._httpx = httpx

    def __repr__(self) -> str:  # never the key
        return f"OpenAIEmbedder(model={self.model!r}, dims={self.dims}, url={self.url!r})"

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        body: dict[str, Any] = {"model": self.model, "input": list(texts), "encoding_format": "float"}
        if self.send_dimensions:
            body["dimensions"] = self.dims
        content = msgspec.json.encode(body)
        try:
            response = self._client.post(self.url, content=content, headers=self._auth())
            if response.status_code == 401 and self._key_ref is not None:  # expired: refresh, once
                response = self._client.post(self.url, content=content, headers=self._auth(refresh=True))
        except self._httpx.TimeoutException:
            raise ModelUnavailable(f"embeddings at {self.url}: timed out after {self.timeout:g} s") from None
        except self._httpx.HTTPError as exc:
            raise ModelUnavailable(f"embeddings at {self.url}: {type(exc).__name__}: {exc}") from None
        return self._vectors(response, len(texts))

    def _auth(self, *, refresh: bool = False) -> dict[str, str] | None:
        ref = self._key_ref
        if ref is None:
            return None
        value = security.refresh(ref, self._secrets) if refresh else security.resolve(ref, self._secrets)
        return {"authorization": f"Bearer {value.reveal()}"}

    def _vectors(self, response: httpx.Response, count: int) -> list[list[float]]:
        status = response.status_code
        where = f"embeddings at {self.url}: HTTP {status}"
        if status in (408, 409, 429) or status >= 500:
            quota = b"insufficient_quota" in response.content
            if not quota:
                raise ModelUnavailable(f"{where}: {error_message(response)}", status_code=status,
                                       retry_after=retry_after(response.headers))
        if not 200 <= status < 300:
            raise ModelRequestError(f"{where}: {error_message(response)}", status_code=status)
        try:
            data = msgspec.json.decode(response.content)["data"]
            rows = sorted(data, key=lambda row: int(row["index"]))
            vectors = [[float(x) for x in row["embedding"]] for row in rows]
        except (msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
            raise ModelRequestError(f"{where}: not an embeddings answer ({type(exc).__name__})",
                                    status_code=status) from None
        if len(vectors) != count:
            raise ModelRequestError(f"{where}: {len(vectors)} embeddings for {count} texts",
                                    status_code=status)
        for vector in vectors:
            if len(vector) != self.dims:
                raise ModelRequestError(f"{where}: an embedding of {len(vector)} dimensions, not {self.dims}",
                                        status_code=status)
            if not all(math.isfinite(x) for x in vector):
                raise ModelRequestError(f"{where}: an embedding with a non-finite number", status_code=status)
        return vectors

    def close(self) -> None:
        self._client.close()
