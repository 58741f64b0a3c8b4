"""Prose figures of a package: lines, docstring lines (share), comment lines, lines with a Sphinx
role, functions with 5+ line docstrings or a docstring longer than their body, module docstrings
over 12 lines, the largest modules.

    python3 scripts/prose_figures.py [src/normlab]
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

ROLES = (":func:", ":class:", ":meth:", ":data:", ":mod:", ":attr:", ":exc:")
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)


def docstring_lines(node: ast.AST) -> int:
    """Lines of ``node``'s docstring (0 without one)."""
    body = getattr(node, "body", None)
    first = body[0] if body else None
    is_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    if not (is_doc and isinstance(first.value.value, str)):
        return 0
    return first.end_lineno - first.lineno + 1


def figures(root: Path) -> dict:
    files = [root] if root.is_file() else sorted(root.rglob("*.py"))
    out = {"lines": 0, "doc": 0, "comment": 0, "roles": 0, "five_plus": 0, "longer": 0}
    out |= {"long_modules": [], "sizes": []}
    for path in files:
        text = path.read_text()
        lines = text.splitlines()
        out["lines"] += len(lines)
        out["sizes"].append((len(lines), str(path)))
        tokens = tokenize.generate_tokens(io.StringIO(text).readline)
        out["comment"] += sum(t.type == tokenize.COMMENT for t in tokens)
        out["roles"] += sum(any(r in line for r in ROLES) for line in lines)
        for node in ast.walk(ast.parse(text)):
            d = docstring_lines(node) if isinstance(node, (ast.Module, ast.ClassDef, *DEFS)) else 0
            out["doc"] += d
            if isinstance(node, ast.Module) and d > 12:
                out["long_modules"].append((d, str(path)))
            if isinstance(node, DEFS) and d:
                rest = node.body[1:]
                body = rest[-1].end_lineno - rest[0].lineno + 1 if rest else 0
                out["five_plus"] += d >= 5
                out["longer"] += d > body
    return out


def main() -> None:
    f = figures(Path(sys.argv[1] if len(sys.argv) > 1 else "src/normlab"))
    n = f["lines"]
    print(f"lines {n}; docstring lines {f['doc']} ({100 * f['doc'] / n:.1f}%); comment lines")
    print(f"  {f['comment']} ({100 * f['comment'] / n:.1f}%); Sphinx-role lines {f['roles']}")
    print(f"functions with 5+ line docstrings: {f['five_plus']}; docstring > body: {f['longer']}")
    print(f"module docstrings over 12 lines: {len(f['long_modules'])}")
    print("largest modules:", sorted(f["sizes"], reverse=True)[:4])


if __name__ == "__main__":
    main()
