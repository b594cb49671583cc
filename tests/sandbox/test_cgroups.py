"""The sandbox's cgroups on this host's real hierarchy: ``stop`` leaves no
process of a group alive (what ends a sandbox whose bwrap was killed before
its PID namespace existed), and leftovers of dead workers are swept, never
a live or fresh one."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from cairn.sandbox import Limits, cgroups, launcher

pytestmark = pytest.mark.slow


def test_stop_kills_every_process_of_the_group(ws: Path) -> None:
    group = cgroups.Group.make(pids_max=16, memory_max=64 << 20)
    try:
        # detached every way a process can be: background, setsid, a double fork
        script = "sleep 60 & setsid sleep 60 & (sleep 60 &) ; echo started; wait"
        with subprocess.Popen(launcher.command(group.joins, Limits(), ["/bin/sh", "-c", script]),
                              stdout=subprocess.PIPE, env={"PATH": "/usr/bin:/bin"}) as process:
            assert process.stdout is not None
            assert process.stdout.readline() == b"started\n"
            members = group._tasks()
            assert len(members) >= 4, members  # the shell and its three sleeps, in every hierarchy's group
            assert group.stop(wait=10)
            process.wait(timeout=10)
        assert [pid for pid in members if not cgroups.exiting(pid)] == []
        assert all(cgroups.exiting(pid) for pid in group._tasks())
    finally:
        group.stop()
        group.remove()


def test_leftovers_of_dead_makers_are_swept(ws: Path) -> None:
    where = cgroups.place("pids")
    assert where is not None
    never_alive = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process has this pid
    old_dead = where.parent / f"{cgroups.PREFIX}{never_alive}-test-old"
    fresh_dead = where.parent / f"{cgroups.PREFIX}{never_alive}-test-fresh"
    old_live = where.parent / f"{cgroups.PREFIX}{os.getpid()}-test-old"
    made = [old_dead, fresh_dead, old_live]
    try:
        for path in made:
            path.mkdir()
        long_ago = time.time() - 2 * cgroups.STALE_SECONDS
        os.utime(old_dead, (long_ago, long_ago))
        os.utime(old_live, (long_ago, long_ago))
        cgroups._swept.cache_clear()
        cgroups.Group.make(pids_max=4).remove()
        assert not old_dead.exists()
        assert fresh_dead.exists()  # its maker may be about to join it (another pid namespace)
        assert old_live.exists()
    finally:
        for path in made:
            if path.exists():
                path.rmdir()
