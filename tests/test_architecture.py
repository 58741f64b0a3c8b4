"""The layout of DESIGN.md, checked: imports point one way, functions fit on a screen (modules
are sized by job, not by line count), and only ``commands/`` holds entry points (``main()``,
argparse, ``hydra.main``, ``print``, ``sys.exit``).

Every import is walked, the ones inside functions too: a cycle cannot hide behind a deferred one.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "normlab"

#: Which layers each layer may import (besides itself). A layer is the first part of the module path
#: below ``normlab``; the top-level ``__init__`` is not a layer.
ALLOWED: dict[str, set[str]] = {
    "config": set(),
    "compose": {"config"},
    "norms": {"config"},
    "model": {"config", "norms"},
    "data": {"config"},
    "training": {"config", "norms", "model", "data"},
    "report": {"config"},
    "bench": {"config", "compose", "norms", "model", "data", "training"},
    "studies": {"config", "compose", "norms", "model", "data", "training", "bench", "report"},
    "evals": {"config", "norms", "model", "data", "training"},
    "commands": {
        "config",
        "compose",
        "norms",
        "model",
        "data",
        "training",
        "report",
        "bench",
        "studies",
        "evals",
    },
}
#: The longest a function may be, in lines (DESIGN.md: about 60, a screen); argparse builders
#: (functions named ``*parser``), a list of options rather than logic, are exempt.
FUNCTION_LINES = 80
#: The most branches a function may have (ruff's C901, as pyproject.toml sets it for ruff too).
MAX_COMPLEXITY = 12
#: Packages whose imports are confined to some layers: the heavy or entry-point ones.
CONFINED = {
    "torch": set(ALLOWED) - {"config", "compose", "report", "commands"} | {"commands"},
    "hydra": {"compose", "commands"},
    "argparse": {"commands"},
}


def modules() -> dict[str, Path]:
    """``normlab.x.y`` -> its file, for every module of the package."""
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def imports(module: str, path: Path) -> list[tuple[str, int]]:
    """Every module ``module`` imports (absolute names; relative ones resolved), with its line."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.append((base, node.lineno))
            found += [
                (f"{base}.{a.name}", node.lineno) for a in node.names
            ]  # `from pkg import mod`
    return found


def internal_graph() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        graph[name] = {m for m, _ in imports(name, path) if m in mods and m != name}
    return graph


def test_every_import_points_down_the_layer_order():
    bad = []
    for name, path in modules().items():
        here = layer(name)
        if here is None:
            continue
        for target, line in imports(name, path):
            there = layer(target) if target.startswith("normlab.") else None
            if there and there != here and there not in ALLOWED[here]:
                bad.append(f"{path.relative_to(SRC)}:{line} ({here}) imports {target} ({there})")
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_no_import_cycle_between_modules():
    graph = internal_graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            # a package's __init__ importing its own submodules is not a cycle of design
            if node == nxt.rsplit(".", 1)[0] or nxt == node.rsplit(".", 1)[0]:
                continue
            if state.get(nxt) == 1:
                cycles.append(
                    " -> ".join(stack[stack.index(nxt) :] + [node, nxt])
                    if nxt in stack
                    else f"{node} -> {nxt}"
                )
            elif nxt not in state:
                visit(nxt, [*stack, node])
        state[node] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_heavy_and_entry_point_packages_are_imported_only_where_allowed():
    bad = []
    for name, path in modules().items():
        here = layer(name)
        for target, line in imports(name, path):
            top = target.split(".")[0]
            if top in CONFINED and here not in CONFINED[top]:
                bad.append(f"{path.relative_to(SRC)}:{line} ({here}) imports {top}")
    assert not bad, "\n".join(bad)


def _calls(tree: ast.AST) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name):
                out.append((f.id, node.lineno))
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                out.append((f"{f.value.id}.{f.attr}", node.lineno))
    return out


def test_only_commands_print_exit_or_define_main():
    bad = []
    for name, path in modules().items():
        if layer(name) == "commands":
            continue
        tree = ast.parse(path.read_text())
        bad += [
            f"{path.relative_to(SRC)}:{ln} calls {c}"
            for c, ln in _calls(tree)
            if c in ("print", "sys.exit")
        ]
        bad += [
            f"{path.relative_to(SRC)}:{n.lineno} defines main()"
            for n in tree.body
            if isinstance(n, ast.FunctionDef) and n.name == "main"
        ]
    assert not bad, "\n".join(bad)


def long_functions(path: Path, limit: int = FUNCTION_LINES) -> list[str]:
    """``file:line name (n lines)`` for every function of ``path`` longer than ``limit`` lines,
    argparse builders aside."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = node.end_lineno - node.lineno + 1
            if n > limit and not node.name.endswith("parser"):
                out.append(f"{path.name}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_every_function_fits_on_a_screen():
    bad = [f for path in modules().values() for f in long_functions(path)]
    assert not bad, f"functions over {FUNCTION_LINES} lines (split by step):\n" + "\n".join(bad)


def test_no_function_is_more_complex_than_ruffs_c901_limit():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    r = subprocess.run(
        [
            ruff,
            "check",
            "--no-cache",
            "--select",
            "C901",
            "--config",
            f"lint.mccabe.max-complexity={MAX_COMPLEXITY}",
            str(SRC),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout


def test_the_checks_above_can_fail(tmp_path):
    """The walker sees function-local and relative imports (what a cycle hides behind)."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from ..training import loop\n    import torch\n")
    found = {m for m, _ in imports("normlab.report.m", f)}
    assert "normlab.training.loop" in found and "torch" in found
    long = tmp_path / "long.py"
    long.write_text(
        "def f():\n"
        + "    x = 1\n" * FUNCTION_LINES
        + "\ndef build_parser():\n"
        + "    x = 1\n" * FUNCTION_LINES
    )
    assert long_functions(long) == [f"long.py:1 f ({FUNCTION_LINES + 1} lines)"]
