"""Tests and code leave torch's global config as they found it (issue 37, kind 17).

A test that changes dynamo's config and leaves it changed (or deleted: a monkeypatch undo can
delete a config entry, and torch then says it "does not exist") breaks whichever test runs after
it in the same worker, so the suite's result depended on its order. Every change goes through a
context that restores it exactly (``torch._dynamo.config.patch``); the checks here hold code and
tests to that, and run the tests that touch torch's state before the bench tests in one process,
so an order-dependent failure shows here rather than in CI.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from .conftest import REPO

THIS = Path(__file__).resolve()
BENCH_TESTS = "tests/bench/test_bench_norms_empty.py"
#: What changes torch's process-wide state in a test or fixture.
TOUCHES = re.compile(
    r"torch\._(dynamo|inductor|functorch)\.config|torch\.backends\.|set_num_threads|"
    r"set_default_dtype|use_deterministic_algorithms|set_float32_matmul_precision"
)
CONFIG = r"torch\._(?:dynamo|inductor|functorch)\.config"
#: A monkeypatch of a config module: its undo deletes the entry (pytest >= 9.2), hiding it.
MONKEYPATCHED = re.compile(rf"monkeypatch\.(?:setattr|delattr)\(\s*[\"']?{CONFIG}")
#: An assignment to a config entry: a change that nothing undoes.
ASSIGNED = re.compile(rf"{CONFIG}\.\w+\s*=[^=]")


def _sources(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (REPO / f).rglob("*.py") if p.resolve() != THIS)


def test_no_test_monkeypatches_torchs_config():
    found = [
        f"{p.relative_to(REPO)}:{n}"
        for p in _sources("tests")
        for n, line in enumerate(p.read_text().splitlines(), start=1)
        if MONKEYPATCHED.search(line)
    ]
    assert found == [], "use torch._dynamo.config.patch(...), which restores the entry exactly"


def test_no_code_assigns_to_torchs_config():
    found = [
        f"{p.relative_to(REPO)}:{n}"
        for p in _sources("src", "benchmarks", "tests")
        for n, line in enumerate(p.read_text().splitlines(), start=1)
        if ASSIGNED.search(line)
    ]
    assert found == [], "use torch._dynamo.config.patch(...) around the code that needs it"


def touching_tests() -> list[str]:
    """Node ids of the tests that touch torch's state (:data:`TOUCHES`): each test whose body or
    requested fixture does, and for a module whose autouse fixture does, its test with the fewest
    parametrizations (one test enters the fixture as every other does)."""
    ids = []
    for path in _sources("tests"):
        text = path.read_text()
        if not path.name.startswith("test_") or not TOUCHES.search(text):
            continue
        functions = [n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)]
        touching = {f.name for f in functions if TOUCHES.search(ast.get_source_segment(text, f))}
        tests = [f for f in functions if f.name.startswith("test_")]
        autouse = any(f.name in touching and _autouse(f) for f in functions)
        chosen = [f for f in tests if f.name in touching or touching & _arguments(f)]
        if autouse and tests and not chosen:
            chosen = [min(tests, key=lambda f: len(f.decorator_list))]
        ids += [f"{path.relative_to(REPO)}::{f.name}" for f in chosen]
    return ids


def _arguments(f: ast.FunctionDef) -> set[str]:
    return {a.arg for a in f.args.args}


def _autouse(f: ast.FunctionDef) -> bool:
    """``f`` is decorated ``@pytest.fixture(..., autouse=True)``."""
    return any(
        isinstance(d, ast.Call)
        and any(k.arg == "autouse" and getattr(k.value, "value", None) is True for k in d.keywords)
        for d in f.decorator_list
    )


def test_the_tests_that_touch_torchs_state_leave_it_and_the_bench_tests_as_they_found_them():
    """In one process, no randomized order: the tests that touch torch's state, then the bench
    tests that broke after them; ``tests/torch_state.py`` fails the run, naming the test and the
    entry, if any test leaves torch's state changed."""
    ids = touching_tests()
    assert any("test_train.py::" in i for i in ids)  # the selection finds what it is for
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider"]
        + ["-p", "tests.torch_state", "-n", "0", "-q", "--timeout=900", *ids, BENCH_TESTS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    leaks = [line for line in proc.stdout.splitlines() if line.startswith("TORCH STATE LEAK")]
    assert leaks == [] and proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
