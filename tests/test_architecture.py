"""The layout of docs/ARCHITECTURE.md, checked: imports point one way, functions fit on a screen
(modules are sized by job, none over ``MODULE_LINES``), only ``commands/`` holds entry points
(``main()``, argparse, ``hydra.main``, ``print``, ``sys.exit``), and docstrings stay contracts: a
module's at most ``MODULE_DOC_LINES`` lines, no Sphinx role, a small share (``DOC_SHARE``).

Every import is walked, the ones inside functions too: a cycle cannot hide behind a deferred one.
"""

from __future__ import annotations

import ast
import re
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
#: The longest a function may be, in lines (about a screen); argparse builders
#: (functions named ``*parser``), a list of options rather than logic, are exempt.
FUNCTION_LINES = 80
#: The most branches a function may have (ruff's C901, as pyproject.toml sets it for ruff too).
MAX_COMPLEXITY = 12
#: The longest a module may be, in lines: past it, a module holds more than one job (split by job).
MODULE_LINES = 800
#: The longest a module docstring may be, in lines: what the module is for, then
#: "Why: docs/<page>.md" (the explanation lives on that page, once).
MODULE_DOC_LINES = 12
#: The most of src/normlab's lines that docstrings may take: a docstring states a contract in 1-3
#: lines, the why is on a docs page. A ceiling a little above the measured share (the failure
#: message gives the share).
DOC_SHARE = 0.12
#: Sphinx cross-reference roles: the docs are read as plain text, in an editor and on GitHub.
SPHINX_ROLE = re.compile(r":(?:func|class|meth|data|attr|mod|exc):`")
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


def docstring_lines(path: Path) -> tuple[int, int]:
    """``(lines of the module docstring, lines of every docstring)`` of ``path``."""
    module = total = 0
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    n = body[0].end_lineno - body[0].lineno + 1
                    total += n
                    module = n if isinstance(node, ast.Module) else module
    return module, total


def prose_problems(path: Path) -> dict[str, list[str]]:
    """``kind -> [file: problem]``: ``lines`` (over ``MODULE_LINES``), ``docstring`` (a module
    docstring over ``MODULE_DOC_LINES``), ``sphinx`` (each line with a Sphinx role)."""
    lines = path.read_text().splitlines()
    module_doc, _ = docstring_lines(path)
    return {
        "lines": [f"{path.name}: {len(lines)} lines"] if len(lines) > MODULE_LINES else [],
        "docstring": (
            [f"{path.name}: a module docstring of {module_doc} lines"]
            if module_doc > MODULE_DOC_LINES
            else []
        ),
        "sphinx": [f"{path.name}:{i}" for i, t in enumerate(lines, 1) if SPHINX_ROLE.search(t)],
    }


def _problems(kind: str) -> list[str]:
    return [p for path in modules().values() for p in prose_problems(path)[kind]]


def test_no_module_is_over_its_line_limit():
    bad = _problems("lines")
    assert not bad, f"modules over {MODULE_LINES} lines (split by job):\n" + "\n".join(bad)


def test_no_module_docstring_is_over_its_line_limit():
    bad = _problems("docstring")
    assert not bad, "long module docstrings (the why goes to docs/<page>.md):\n" + "\n".join(bad)


def test_no_sphinx_role_in_the_package():
    bad = _problems("sphinx")
    assert not bad, "Sphinx roles (write ``name`` instead):\n" + "\n".join(bad)


def doc_share(paths: list[Path]) -> tuple[int, int]:
    """``(docstring lines, lines)`` over ``paths``."""
    doc = total = 0
    for path in paths:
        doc += docstring_lines(path)[1]
        total += len(path.read_text().splitlines())
    return doc, total


def test_docstrings_are_a_small_share_of_the_package():
    doc, total = doc_share(list(modules().values()))
    assert doc <= DOC_SHARE * total, (
        f"docstrings are {doc} of {total} lines ({doc / total:.1%}), over {DOC_SHARE:.0%}: "
        "state each contract in 1-3 lines and move the why to docs/<page>.md"
    )


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
    prose = tmp_path / "prose.py"
    doc = "\n".join(["line"] * MODULE_DOC_LINES)
    prose.write_text(f'"""{doc}\n"""\n# see :func:`f`\n' + "x = 1\n" * MODULE_LINES)
    assert prose_problems(prose) == {
        "lines": [f"prose.py: {MODULE_DOC_LINES + MODULE_LINES + 2} lines"],
        "docstring": [f"prose.py: a module docstring of {MODULE_DOC_LINES + 1} lines"],
        "sphinx": [f"prose.py:{MODULE_DOC_LINES + 2}"],
    }
    assert doc_share([prose]) == (MODULE_DOC_LINES + 1, MODULE_DOC_LINES + MODULE_LINES + 2)
