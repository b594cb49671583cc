"""A local stand-in for Vault's transit engine (encrypt, decrypt), enough for
``VaultTransitKeyring``: a thread serving HTTP on 127.0.0.1, AES-256-GCM per
named key and key version, ``associated_data`` bound, ``X-Vault-Token``
checked, errors as Vault gives them (``{"errors": [...]}``)."""

from __future__ import annotations

import base64
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM


class TransitStandIn:
    def __init__(self, token: str) -> None:
        self.token = token
        self.keys: dict[str, list[bytes]] = {}
        self.calls: list[str] = []
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                status, answer = standin.handle(self.path, self.headers.get("X-Vault-Token"), body)
                raw = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def rotate(self, name: str) -> None:
        self.keys.setdefault(name, []).append(os.urandom(32))

    def handle(self, path: str, token: str | None, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.calls.append(path)
        if token != self.token:
            return 403, {"errors": ["permission denied"]}
        parts = path.strip("/").split("/")  # v1/<mount>/<action>/<name>
        if len(parts) != 4 or parts[0] != "v1" or parts[2] not in ("encrypt", "decrypt"):
            return 404, {"errors": ["no handler for route"]}
        name = parts[3]
        aad = base64.b64decode(body.get("associated_data", ""))
        if parts[2] == "encrypt":
            if name not in self.keys:
                self.rotate(name)  # Vault creates a transit key on first encrypt (upsert)
            version = len(self.keys[name])
            nonce = os.urandom(12)
            sealed = AESGCM(self.keys[name][-1]).encrypt(nonce, base64.b64decode(body["plaintext"]), aad)
            ciphertext = f"vault:v{version}:" + base64.b64encode(nonce + sealed).decode()
            return 200, {"data": {"ciphertext": ciphertext, "key_version": version}}
        try:
            _, version, blob = str(body["ciphertext"]).split(":", 2)
            raw = base64.b64decode(blob)
            key = self.keys[name][int(version[1:]) - 1]
            plain = AESGCM(key).decrypt(raw[:12], raw[12:], aad)
        except (InvalidTag, KeyError, ValueError, IndexError):
            return 400, {"errors": ["cipher: message authentication failed"]}
        return 200, {"data": {"plaintext": base64.b64encode(plain).decode()}}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
