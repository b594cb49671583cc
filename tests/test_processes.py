"""The rule that keeps ``pytest -m "not slow"`` quick: a test not marked
``slow`` cannot start a process (``tests/processes.py``, installed by the
root conftest for every test). Each way of starting one is refused before
anything is forked, so these tests start none."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest

from tests import processes
from tests.processes import SpawnWithoutSlowMark

ROUTES = {
    "subprocess.run": lambda: subprocess.run(["true"], check=False),
    "subprocess.Popen": lambda: subprocess.Popen([sys.executable, "-c", "pass"]),
    "os.system": lambda: os.system("true"),
    "os.posix_spawn": lambda: os.posix_spawn("/bin/true", ["true"], os.environ),
    "os.fork": os.fork,
    "multiprocessing spawn": lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    "multiprocessing forkserver": lambda: multiprocessing.get_context("forkserver").Process(
        target=print).start(),
}


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_test_not_marked_slow_cannot_start_a_process(route: str) -> None:
    with processes.guard("tests/example.py::test_quick", slow=False) as refused, \
            pytest.raises(SpawnWithoutSlowMark, match=r"test_quick started a process .* not marked slow"):
        ROUTES[route]()
    assert len(refused) == 1, "a refusal is remembered, so a test that swallows it still fails"


def test_the_root_conftest_guards_every_test() -> None:
    """Not only tests that ask: this one is unmarked, and its spawn is refused."""
    with pytest.raises(SpawnWithoutSlowMark, match="test_the_root_conftest_guards_every_test"):
        subprocess.run(["true"], check=False)
    processes._state["spawned"].clear()  # refused on purpose: not this test's failure
