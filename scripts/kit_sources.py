"""The GPU kit's staleness record: the sources its normlab wheel was built from.

``record WHEEL``: prints one ``sha256sum`` line per file the wheel packs (``normlab/...`` from
``src/normlab/``, ``normlab/conf/...`` from ``conf/``), the hash of the bytes inside the wheel and
the file's path in the working tree. Untracked files are in the wheel (the build packs what is
not git-ignored), so they are in the record. ``scripts/gpu_kit.sh`` writes it to
``sources.sha256``.

``check SOURCES``: exit 0 when the working tree (the current folder) holds exactly the record's
sources: every recorded file with its hash, and no file under ``src/normlab`` or ``conf`` that
the record lacks (bytecode and ``__pycache__`` aside: the build leaves them out). Otherwise one line
on stderr naming the first difference, exit 1. ``scripts/gpu_run.sh`` runs it before installing
the kit. Standard library only: it runs on the bare device machine.
"""

from __future__ import annotations

import hashlib
import sys
import zipfile
from pathlib import Path

#: The wheel's folders and the working-tree folders they are packed from, most specific first.
PACKED_FROM = (("normlab/conf/", "conf/"), ("normlab/", "src/normlab/"))
#: Files under those folders the build leaves out (the repository's .gitignore).
LEFT_OUT_DIRS = {"__pycache__"}
LEFT_OUT_SUFFIXES = (".pyc", ".pyo")


def source_path(member: str) -> str | None:
    """The working-tree path a wheel member was packed from; None for the wheel's own metadata."""
    for inside, outside in PACKED_FROM:
        if member.startswith(inside):
            return outside + member[len(inside) :]
    return None


def record(wheel: Path) -> list[str]:
    """``sha256sum`` lines (``<hex>  <path>``) of every source file ``wheel`` packs, by path."""
    lines = []
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            path = source_path(info.filename)
            if path is not None and not info.is_dir():
                lines.append(f"{hashlib.sha256(zf.read(info)).hexdigest()}  {path}")
    return sorted(lines, key=lambda line: line.split("  ", 1)[1])


def packable(root: Path) -> set[str]:
    """The files under ``root``'s ``src/normlab`` and ``conf`` that a build would pack."""
    found = set()
    for _, outside in PACKED_FROM:
        for f in (root / outside).rglob("*"):
            rel = f.relative_to(root)
            left_out = LEFT_OUT_DIRS & set(rel.parts) or f.name.endswith(LEFT_OUT_SUFFIXES)
            if f.is_file() and not left_out:
                found.add(rel.as_posix())
    return found


def difference(sources: Path, root: Path) -> str | None:
    """Why ``root`` does not hold the sources ``sources`` records, or None when it does."""
    recorded = {}
    for line in sources.read_text().splitlines():
        digest, _, path = line.partition("  ")
        recorded[path] = digest
    for path, digest in sorted(recorded.items()):
        f = root / path
        if not f.is_file():
            return f"{path} is in the kit but not here"
        if hashlib.sha256(f.read_bytes()).hexdigest() != digest:
            return f"{path} changed since the kit was built"
    extra = sorted(packable(root) - set(recorded))
    if extra:
        return f"{extra[0]} is here but not in the kit" + (
            f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        )
    return None


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "record":
        print("\n".join(record(Path(argv[1]))))
        return 0
    if len(argv) == 2 and argv[0] == "check":
        try:
            why = difference(Path(argv[1]), Path.cwd())
        except (OSError, UnicodeDecodeError) as e:
            why = f"cannot read {argv[1]}: {e.strerror if isinstance(e, OSError) else e}"
        if why is not None:
            print(why, file=sys.stderr)
            return 1
        return 0
    print("usage: kit_sources.py record WHEEL | check SOURCES", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
