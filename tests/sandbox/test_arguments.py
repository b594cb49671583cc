"""Bad input to the sandbox: a one-line ``InvalidArgument`` naming the
problem, raised before anything is started or written."""

from __future__ import annotations

from pathlib import Path

import pytest

from cairn.errors import InvalidArgument
from cairn.sandbox import Limits, Policy, run, run_python


@pytest.mark.parametrize(("argv", "env"), [([], None), ([""], None), (["echo", "a\0b"], None),
                                            (["true"], {"A=B": "x"}), (["true"], {"": "x"}),
                                            (["true"], {"A": "x\0y"})])
def test_bad_commands_are_refused(tmp_path: Path, argv: list[str], env: dict[str, str] | None) -> None:
    with pytest.raises(InvalidArgument) as caught:
        run(argv, tmp_path, env=env)
    assert "\n" not in str(caught.value)
    assert not list(tmp_path.iterdir())


def test_a_missing_workspace_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="is not a directory"):
        run(["true"], tmp_path / "nowhere")
    with pytest.raises(InvalidArgument, match="NUL"):
        run_python("print(1)\0", tmp_path)


INT_FIELDS = ("processes", "memory_bytes", "file_bytes", "cpu_seconds", "open_files", "tmp_bytes",
              "output_bytes")
BAD = [(f, v) for f in INT_FIELDS for v in (0, -1, True, "10")] + [("wall_seconds", v) for v in (0, -1, "10")]


@pytest.mark.parametrize(("field", "value"), BAD)
def test_bad_limits_are_refused_where_written(field: str, value: object) -> None:
    with pytest.raises(InvalidArgument, match=field):
        Limits(**{field: value})  # type: ignore[arg-type]


def test_allow_degraded_is_a_collection_of_known_names() -> None:
    with pytest.raises(InvalidArgument, match="not a string"):
        Policy(allow_degraded="seccomp")
    assert Policy(allow_degraded=["seccomp"]).allow_degraded == frozenset({"seccomp"})
