"""Isolated execution of untrusted code (``run``, ``run_python``, and the
``sandbox_tool`` of an App): bubblewrap namespaces, a seccomp filter,
rlimits, a wall clock that ends the whole sandbox, and no network but an
allowlisted egress proxy; ``Pool``: sandboxes launched ahead of their
commands; ``Policy(tier="gvisor")``: the same under gVisor's ``runsc``
(``gvisor``). docs/sandbox.md is the threat model.
"""

from cairn.sandbox.controls import Control, SandboxUnavailable, check
from cairn.sandbox.policy import Egress, Limits, Policy
from cairn.sandbox.pool import Pool
from cairn.sandbox.runner import Result, run, run_python

__all__ = ["Control", "Egress", "Limits", "Policy", "Pool", "Result", "SandboxUnavailable", "check", "run",
           "run_python"]
