"""torch's process-wide settings, and a pytest plugin that names the test that leaves them changed.

:func:`snapshot` reads every entry of dynamo's, inductor's and functorch's config modules (an entry
deleted by a patch's undo reads as :data:`HIDDEN`: torch then refuses to read or patch it) and the
process flags tests touch (threads, default dtype, grad mode, deterministic algorithms, float32
matmul precision). As a plugin (``python -m pytest -p tests.torch_state ...``) it takes a snapshot
around every test and fails the session, naming each test and entry, when one differs after the
test's teardown (the first test's is read after its setup and the last test's before its teardown:
there the session-scoped fixtures set and restore their own state). ``tests/test_torch_state.py``
runs it over the tests that touch torch's state.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

#: The config modules whose entries a test may change (each imported by :func:`pytest_configure`,
#: so a test that first imports one cannot change it unseen).
CONFIG_MODULES = ("torch._dynamo.config", "torch._inductor.config", "torch._functorch.config")
HIDDEN = "<deleted: torch says it does not exist>"
_LEAKS = pytest.StashKey[list]()
_BEFORE = pytest.StashKey[dict]()


def snapshot() -> dict[str, Any]:
    """``{name: value}`` of every config entry and process flag (module docstring)."""
    out: dict[str, Any] = {
        "torch.get_num_threads()": torch.get_num_threads(),
        "torch.get_default_dtype()": torch.get_default_dtype(),
        "torch.is_grad_enabled()": torch.is_grad_enabled(),
        "torch.are_deterministic_algorithms_enabled()": (
            torch.are_deterministic_algorithms_enabled()
        ),
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
    }
    for name in CONFIG_MODULES:
        config = importlib.import_module(name)
        for key in config.get_config_copy():
            out[f"{name}.{key}"] = getattr(config, key, HIDDEN)
    return out


def changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """``"name: before -> after"`` of each entry that differs (values compared with ``==``)."""
    out = []
    for key in sorted(before.keys() | after.keys()):
        a, b = before.get(key, HIDDEN), after.get(key, HIDDEN)
        try:
            same = bool(a == b)
        except Exception:  # an entry whose values do not compare: by identity
            same = a is b
        if not same:
            out.append(f"{key}: {a!r} -> {b!r}")
    return out


def pytest_configure(config: pytest.Config) -> None:
    for name in CONFIG_MODULES:
        importlib.import_module(name)
    config.stash[_LEAKS] = []


# A test's state is read before its setup and after its teardown, except where the session's own
# fixtures act (``conftest.py``'s one thread): after the first test's setup, before the last's
# teardown.


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    first = _BEFORE not in item.config.stash
    item.config.stash[_BEFORE] = None if first else snapshot()  # None: read after its setup
    yield
    if nextitem is not None:
        _judge(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    yield
    if item.config.stash[_BEFORE] is None:
        item.config.stash[_BEFORE] = snapshot()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem):
    if nextitem is None:
        _judge(item)
    yield


def _judge(item: pytest.Item) -> None:
    before = item.config.stash[_BEFORE]
    diff = changed(before, snapshot()) if before is not None else []
    if diff:
        item.config.stash[_LEAKS].append(f"{item.nodeid} left {'; '.join(diff)}")


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    for leak in config.stash[_LEAKS]:
        terminalreporter.write_line(f"TORCH STATE LEAK: {leak}")


def pytest_sessionfinish(session: pytest.Session, exitstatus) -> None:
    if session.config.stash[_LEAKS] and exitstatus == 0:
        session.exitstatus = 1
