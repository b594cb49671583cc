"""A keyring whose key-encryption key is an AWS KMS key.

The KEK never leaves KMS: a data key is wrapped by KMS ``Encrypt`` and
unwrapped by ``Decrypt``, with the data key's tenant and version as the
request's *encryption context* (KMS binds the ciphertext to it, as AES-GCM
associated data: a wrapped key moved to another tenant or version does not
unwrap). ``Decrypt`` names the key it expects (``KeyId``), so a ciphertext
of another KMS key is refused rather than opened with whichever key made it.
The KEK id stored with each data key is ``aws-kms:<key id or ARN>``;
KMS keeps its own key material versions inside the ciphertext, so rotating
the key in KMS (automatic rotation) needs no rewrap here, and ``cairn keys
rotate --kek`` after pointing the keyring at another key rewraps every data
key with it.

``GenerateDataKey`` is not used: the ``Keyring`` protocol wraps a data key
the store generated (``os.urandom``), which ``Encrypt`` does in one call;
having KMS generate it would add nothing but a second code path.

The JSON API over plain ``urllib``, requests signed with Signature Version 4
(``sign``, checked against AWS's published example): no SDK, so no extra
beyond ``encryption`` (boto3 and botocore would be ~100 MB of dependency
for two calls). The trade-off: credentials come from the environment only
(``$AWS_ACCESS_KEY_ID``, ``$AWS_SECRET_ACCESS_KEY``, ``$AWS_SESSION_TOKEN``
for temporary ones), not from instance roles or profiles. The region is
``$AWS_REGION`` (or ``$AWS_DEFAULT_REGION``, or the key ARN's); the
endpoint ``https://kms.<region>.amazonaws.com`` unless
``$AWS_ENDPOINT_URL_KMS`` or ``$AWS_ENDPOINT_URL`` names another, as for
the AWS SDKs. ``keyring_from_spec("aws-kms:alias/cairn")`` opens one.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from cairn.errors import ConfigError
from cairn.security.envelope import SealError

#: how a KEK id of this keyring starts
PREFIX = "aws-kms:"
#: the encryption context key that carries a data key's tenant and version (base64)
CONTEXT_KEY = "cairn-data-key"
#: KMS errors that say the credentials or the permissions are wrong: a configuration problem, not a key's
_AUTH_ERRORS = frozenset({"UnrecognizedClientException", "InvalidSignatureException", "AccessDeniedException",
                          "ExpiredTokenException", "IncompleteSignature", "MissingAuthenticationToken",
                          "InvalidClientTokenId", "SignatureDoesNotMatch"})


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def _quote(text: str, safe: str = "-_.~") -> str:
    return urllib.parse.quote(text, safe=safe)


def sign(method: str, url: str, headers: Mapping[str, str], body: bytes, *, access_key: str, secret_key: str,
         region: str, service: str, amz_date: str) -> str:
    """The ``Authorization`` header of a request signed with AWS Signature
    Version 4: every header given is signed (``host`` and ``x-amz-date``
    must be among them), the query sorted and encoded, the body hashed."""
    parts = urllib.parse.urlsplit(url)
    query = "&".join(sorted(f"{_quote(k)}={_quote(v)}"
                            for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)))
    canonical = {k.lower(): " ".join(v.split()) for k, v in headers.items()}
    names = ";".join(sorted(canonical))
    request = "\n".join((method, _quote(parts.path or "/", safe="/-_.~"), query,
                         "".join(f"{k}:{canonical[k]}\n" for k in sorted(canonical)), names,
                         hashlib.sha256(body).hexdigest()))
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    to_sign = "\n".join(("AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(request.encode()).hexdigest()))
    key = f"AWS4{secret_key}".encode()
    for part in (amz_date[:8], region, service, "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={names}, Signature={signature}"


class AwsKmsKeyring:
    """Wraps data keys with an AWS KMS key (see the module doc)."""

    def __init__(self, key_id: str, *, region: str, access_key: str, secret_key: str,
                 session_token: str | None = None, endpoint: str | None = None,
                 timeout: float = 10.0) -> None:
        if not key_id or any(c.isspace() for c in key_id) or len(key_id) > 2048:
            raise ConfigError(f"bad AWS KMS key id {key_id[:60]!r}")
        if not region or not all(c.isalnum() or c == "-" for c in region):
            raise ConfigError(f"bad or missing AWS region {region[:30]!r}: set $AWS_REGION")
        if not access_key or not secret_key:
            raise ConfigError("no AWS credentials: set $AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY")
        endpoint = endpoint or f"https://kms.{region}.amazonaws.com"
        if not endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"AWS KMS endpoint {endpoint[:60]!r} is not an http(s) URL")
        self.key_id = key_id
        self.region = region
        self.endpoint = endpoint.rstrip("/") + "/"
        self._access_key = access_key
        self._secret_key = secret_key
        self._session_token = session_token
        self.timeout = timeout

    @classmethod
    def from_env(cls, key_id: str) -> AwsKmsKeyring:
        """``key_id`` (an id, an ARN, an alias ``alias/NAME``), the rest from the environment."""
        env = os.environ
        arn_region = key_id.split(":")[3] if key_id.startswith("arn:") and key_id.count(":") >= 5 else ""
        return cls(key_id, region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or arn_region,
                   access_key=env.get("AWS_ACCESS_KEY_ID", ""),
                   secret_key=env.get("AWS_SECRET_ACCESS_KEY", ""),
                   session_token=env.get("AWS_SESSION_TOKEN") or None,
                   endpoint=env.get("AWS_ENDPOINT_URL_KMS") or env.get("AWS_ENDPOINT_URL") or None)

    def current(self) -> str:
        return PREFIX + self.key_id

    def _call(self, kek_id: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
        if not kek_id.startswith(PREFIX):
            raise SealError(f"KEK {kek_id!r} is not an AWS KMS key: this keyring cannot unwrap it")
        data = json.dumps(body).encode()
        amz_date = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
        headers = {"Host": urllib.parse.urlsplit(self.endpoint).netloc, "X-Amz-Date": amz_date,
                   "Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": f"TrentService.{action}"}
        if self._session_token:
            headers["X-Amz-Security-Token"] = self._session_token
        headers["Authorization"] = sign("POST", self.endpoint, headers, data, access_key=self._access_key,
                                        secret_key=self._secret_key, region=self.region, service="kms",
                                        amz_date=amz_date)
        request = urllib.request.Request(self.endpoint, data=data, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # http(s): checked above
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            kind, message = _error(exc)
            detail = f"{exc.code} {kind}" + (f": {message}" if message else "")
            if kind in _AUTH_ERRORS or exc.code in (401, 403):
                problem = f"AWS KMS refused the credentials for {action} with {kek_id} ({detail})"
                raise ConfigError(problem) from None
            raise SealError(f"AWS KMS could not {action} with {kek_id} ({detail}): wrong key, "
                            "or the key row was edited or moved") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ConfigError(f"cannot reach AWS KMS at {self.endpoint}: {reason}") from None
        if not isinstance(answer, dict):
            raise SealError(f"AWS KMS's answer to {action} with {kek_id} is not a JSON object")
        return answer

    def wrap(self, kek_id: str, key: bytes, context: bytes) -> bytes:
        answer = self._call(kek_id, "Encrypt", {
            "KeyId": kek_id.removeprefix(PREFIX), "Plaintext": base64.b64encode(key).decode(),
            "EncryptionContext": {CONTEXT_KEY: base64.b64encode(context).decode()}})
        try:
            return base64.b64decode(str(answer["CiphertextBlob"]), validate=True)
        except (KeyError, ValueError):
            raise SealError(f"AWS KMS's answer to Encrypt with {kek_id} has no ciphertext") from None

    def unwrap(self, kek_id: str, wrapped: bytes, context: bytes) -> bytes:
        answer = self._call(kek_id, "Decrypt", {
            "KeyId": kek_id.removeprefix(PREFIX), "CiphertextBlob": base64.b64encode(wrapped).decode(),
            "EncryptionContext": {CONTEXT_KEY: base64.b64encode(context).decode()}})
        try:
            return base64.b64decode(str(answer["Plaintext"]), validate=True)
        except (KeyError, ValueError):
            raise SealError(f"AWS KMS's answer to Decrypt with {kek_id} has no plaintext") from None


def _error(exc: urllib.error.HTTPError) -> tuple[str, str]:
    """KMS's error type (``__type``, its namespace dropped) and message, on one line (never a key)."""
    try:
        body = json.loads(exc.read())
    except (ValueError, OSError):
        return "", ""
    if not isinstance(body, dict):
        return "", ""
    kind = str(body.get("__type", "")).rpartition("#")[2]
    message = str(body.get("message") or body.get("Message") or "")[:200].replace("\n", " ")
    return kind, message


__all__ = ["AwsKmsKeyring", "sign"]
