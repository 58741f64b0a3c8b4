"""Reading the YAML and JSON of a run dir with limits: a run dir may come from anywhere, so
nothing it says is trusted.

A file is read only when it is a regular file (a link followed) of at most ``max_bytes``
(``YAML_MAX_BYTES``, ``JSON_MAX_BYTES``, ``ROWS_MAX_BYTES``); YAML holds no anchor or alias (an
alias bomb makes a few lines billions of nodes); YAML and JSON nest at most ``MAX_DEPTH`` deep.
Each refusal is a ``RunFileError`` saying why in a few words, for the caller to name the file.

Why: docs/reports.md
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import yaml

YAML_MAX_BYTES = 1 << 20  # .hydra/'s YAML: Hydra writes a few KiB
JSON_MAX_BYTES = 64 << 20  # summary.json: it holds every step's time
ROWS_MAX_BYTES = 1 << 30  # metrics.jsonl: a row a logged step, millions of steps
MAX_DEPTH = 32
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built in: C speed


class RunFileError(ValueError):
    """A run dir's file that is not read: not a regular file, too big, an alias, too deep."""


def read_limited(path: Path, max_bytes: int) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes``; OSError when it cannot be
    opened, RunFileError when not a regular file or too big."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens without waiting for a writer
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RunFileError("not a regular file")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise RunFileError(f"larger than {max_bytes / 2**20:g} MiB")
    return data


def yaml_text(text: str | bytes) -> Any:
    """``text`` as YAML data; RunFileError for an anchor, an alias or nesting deeper than
    ``MAX_DEPTH`` (checked on the parser's events, before any node is built); yaml.YAMLError."""
    depth = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            line = event.start_mark.line + 1
            raise RunFileError(f"a YAML anchor or alias at line {line} (normlab writes none)")
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise RunFileError(f"nested deeper than {MAX_DEPTH}")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 (a safe loader, checked above)


def load_yaml(path: Path, max_bytes: int = YAML_MAX_BYTES) -> Any:
    """The YAML file ``path`` read within the limits; OSError, RunFileError, yaml.YAMLError."""
    return yaml_text(read_limited(path, max_bytes))


def load_json(path: Path, max_bytes: int = JSON_MAX_BYTES) -> Any:
    """The JSON file ``path``, read within the limits (``read_limited``, ``MAX_DEPTH``); OSError,
    RunFileError, ValueError (json.JSONDecodeError) for text that is not JSON."""
    data = read_limited(path, max_bytes)
    try:
        doc = json.loads(data)
    except RecursionError:
        raise RunFileError(f"nested deeper than {MAX_DEPTH}") from None
    if depth(doc) > MAX_DEPTH:
        raise RunFileError(f"nested deeper than {MAX_DEPTH}")
    return doc


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file (``metrics.jsonl``), one a line; blank, torn (a kill
    mid-write), non-object and too deep lines left out. OSError, RunFileError: ``read_limited``."""
    rows = []
    for line in read_limited(path, ROWS_MAX_BYTES).decode(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # blank or torn; nested beyond the parser's stack
            continue
        if isinstance(row, dict) and depth(row) <= MAX_DEPTH:
            rows.append(row)
    return rows


def depth(doc: Any) -> int:
    """How deep lists and dicts nest in ``doc`` (a scalar: 0), without recursion."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, d)
            stack += [(c, d + 1) for c in (node.values() if isinstance(node, dict) else node)]
    return deepest
