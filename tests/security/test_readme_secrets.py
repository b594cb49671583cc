"""The README's "Secrets and credentials" example runs against the real API:
its block is taken from the README, with a prelude standing in for the bank
and the identity provider it names."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = '''
import cairn


class Unauthorized(Exception):
    pass


class Bank:
    Unauthorized = Unauthorized

    def __init__(self):
        self.transfers, self.refused = {}, 0

    def transfer(self, customer, cents, key, auth):
        if auth != "token-2":  # the first token has expired by the time the refund is sent
            self.refused += 1
            raise Unauthorized(f"401 for {auth}")
        return self.transfers.setdefault(key, {"to": customer, "cents": cents, "key": key})


bank = Bank()
issued = []


def fetch_token(ref, access):
    issued.append(f"token-{len(issued) + 1}")
    return issued[-1]


def refresh_token(ref, access):
    return fetch_token(ref, access)


def find_refund(op):
    found = bank.transfers.get(op.operation_id)
    return cairn.Done(found) if found else cairn.NotFound()
'''

POSTLUDE = '''
app.worker().run(max_idle=2)
[run] = app.list_runs(workflow="refunds")
print(run.status.value, bank.refused, len(bank.transfers), issued)
'''


def block() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Secrets and credentials"):]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None
    return found.group(1)


@pytest.mark.slow
def test_the_readme_secrets_example_runs(tmp_path: Path) -> None:
    script = tmp_path / "secrets_example.py"
    script.write_text(PRELUDE + block() + POSTLUDE, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "CAIRN_DB"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "completed 1 1 ['token-1', 'token-2']"
    for path in (tmp_path / ".cairn").iterdir():
        if path.is_file():
            assert b"token-1" not in path.read_bytes(), path
            assert b"token-2" not in path.read_bytes(), path
