"""A local stand-in for AWS KMS's JSON API (Encrypt, Decrypt), enough for
``AwsKmsKeyring``: a thread serving HTTP on 127.0.0.1 that speaks the wire
format (``POST /``, ``X-Amz-Target: TrentService.<Action>``,
``application/x-amz-json-1.1`` bodies, errors as ``{"__type", "message"}``
with status 400), checks each request's Signature Version 4 against the
secret of its access key, resolves key ids, ARNs and aliases, and seals with
AES-256-GCM per key, the encryption context bound as associated data. Its
ciphertext blob names the key that made it, as KMS's does, so ``Decrypt``
with another ``KeyId`` is ``IncorrectKeyException``."""

from __future__ import annotations

import base64
import json
import os
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from cairn.security.awskms import sign

ACCOUNT = "111122223333"


class KmsStandIn:
    def __init__(self, credentials: dict[str, str], region: str = "eu-west-1") -> None:
        self.credentials = credentials  # access key id -> secret
        self.region = region
        self.keys: dict[str, bytes] = {}  # key id -> AES key
        self.aliases: dict[str, str] = {}
        self.calls: list[str] = []
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status, answer = standin.handle(self.path, dict(self.headers.items()), raw)
                out = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def create_key(self, alias: str | None = None) -> str:
        key_id = str(uuid.uuid4())
        self.keys[key_id] = os.urandom(32)
        if alias is not None:
            self.aliases[alias] = key_id
        return key_id

    def arn(self, key_id: str) -> str:
        return f"arn:aws:kms:{self.region}:{ACCOUNT}:key/{key_id}"

    def _resolve(self, given: str) -> str | None:
        if given.startswith("alias/"):
            return self.aliases.get(given)
        key_id = given.rpartition("key/")[2] if given.startswith("arn:") else given
        return key_id if key_id in self.keys else None

    def _signed(self, headers: dict[str, str], raw: bytes) -> tuple[int, dict[str, Any]] | None:
        """``None`` if the request carries a valid signature, else KMS's error."""
        lower = {k.lower(): v for k, v in headers.items()}
        auth = lower.get("authorization", "")
        try:
            credential = auth.split("Credential=", 1)[1].split(",", 1)[0]
            access, _date, region, service, _ = credential.split("/")
            names = auth.split("SignedHeaders=", 1)[1].split(",", 1)[0].split(";")
        except (IndexError, ValueError):
            return 400, {"__type": "IncompleteSignatureException", "message": "malformed Authorization"}
        secret = self.credentials.get(access)
        if secret is None:
            return 400, {"__type": "UnrecognizedClientException",
                         "message": "The security token included in the request is invalid."}
        expected = sign("POST", self.address + "/", {n: lower[n] for n in names if n in lower}, raw,
                        access_key=access, secret_key=secret, region=region, service=service,
                        amz_date=lower.get("x-amz-date", ""))
        if (expected != auth or service != "kms" or region != self.region
                or not {"host", "x-amz-date"} <= set(names)):
            return 400, {"__type": "InvalidSignatureException",
                         "message": "The request signature we calculated does not match the signature "
                                    "you provided."}
        return None

    def handle(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, dict[str, Any]]:
        target = {k.lower(): v for k, v in headers.items()}.get("x-amz-target", "")
        self.calls.append(target)
        refused = self._signed(headers, raw)
        if refused is not None:
            return refused
        if path != "/" or not target.startswith("TrentService."):
            return 400, {"__type": "UnknownOperationException", "message": ""}
        body = json.loads(raw or b"{}")
        aad = json.dumps(body.get("EncryptionContext") or {}, sort_keys=True).encode()
        action = target.removeprefix("TrentService.")
        if action == "Encrypt":
            key_id = self._resolve(str(body.get("KeyId", "")))
            if key_id is None:
                return 400, {"__type": "NotFoundException",
                             "message": f"Key '{body.get('KeyId')}' does not exist"}
            nonce = os.urandom(12)
            sealed = AESGCM(self.keys[key_id]).encrypt(nonce, base64.b64decode(body["Plaintext"]), aad)
            blob = key_id.encode() + b"\0" + nonce + sealed
            return 200, {"CiphertextBlob": base64.b64encode(blob).decode(), "KeyId": self.arn(key_id),
                         "EncryptionAlgorithm": "SYMMETRIC_DEFAULT"}
        if action == "Decrypt":
            try:
                blob = base64.b64decode(body["CiphertextBlob"])
                made_by, _, rest = blob.partition(b"\0")
                key_id = made_by.decode()
                key = self.keys[key_id]
            except (KeyError, ValueError, UnicodeDecodeError):
                return 400, {"__type": "InvalidCiphertextException", "message": ""}
            wanted = body.get("KeyId")
            if wanted is not None and self._resolve(str(wanted)) != key_id:
                return 400, {"__type": "IncorrectKeyException",
                             "message": "The key ID in the request does not identify a CMK that can perform "
                                        "this operation."}
            try:
                plain = AESGCM(key).decrypt(rest[:12], rest[12:], aad)
            except InvalidTag:
                return 400, {"__type": "InvalidCiphertextException", "message": ""}
            return 200, {"Plaintext": base64.b64encode(plain).decode(), "KeyId": self.arn(key_id),
                         "EncryptionAlgorithm": "SYMMETRIC_DEFAULT"}
        return 400, {"__type": "UnknownOperationException", "message": action}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
