"""Runs as the report reads them: a ``Run`` from a run dir (old metric names renamed on load) or
from a series file, the file a report writes so that it rebuilds from it alone; and
``write_atomic``, the one way a report writes a file. No model or training code.

Why: docs/reports.md
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import re
import stat
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from normlab.config import files
from normlab.config.files import RunFileError, depth, load_json, load_yaml
from normlab.report.stats import NAN

RUN_MARKERS = (".hydra", "summary.json", "metrics.jsonl")
#: ``metrics.jsonl`` keys written before the namespaced rename -> their names now. The one place
#: old names are known: ``normalise_row`` applies it to every row on load.
METRIC_RENAMES: dict[str, str] = {
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "step_time_ms": "perf/step_time_ms",
    "tokens_per_s": "perf/tokens_per_s",
}
#: A readable ``metrics.jsonl`` has a row with ``step`` and one of these (after renaming).
KNOWN_METRICS = ("train/loss", "val/loss", *METRIC_RENAMES.values())
#: A run dir's optional file of separately annealed budgets (cool-down branches of one run): one
#: JSON object a line (``budget_steps``, ``branch_from``, ``val/loss``, ``val/bpb``, ...).
ANNEALED_FILE = "annealed.jsonl"
#: What a held-out corpus name may be: it names a figure file (``val_<name>.png``).
CORPUS_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


class ReportError(Exception):
    """Runs that cannot be read or compared; the message is one line for the user."""


@dataclass
class Run:
    """One run: overrides, flat dotted config, metric rows (new names), summary (or None)."""

    path: Path
    overrides: list[str]
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    summary: dict[str, Any] | None
    label: str = ""
    excluded: str | None = None  # the reason, or None when the run counts in the statistics
    name: str = ""
    #: a completed run left out of the comparison by design (a tuned study's other learning
    #: rates, ``tuned.choose_best_lr``): the reason, or None
    set_aside: str | None = None
    #: the rows of the run dir's ``ANNEALED_FILE`` (empty when it has none), as written
    annealed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def seed(self) -> int | None:
        """The run's seed: config ``seed``, else summary ``seed``."""
        return self.config.get("seed", (self.summary or {}).get("seed"))

    @property
    def final_val_loss(self) -> float:
        """Final validation loss in nats/token (nan when absent)."""
        return self.summary_float("final_val_loss")

    def summary_float(self, key: str) -> float:
        """A numeric summary field (its units), nan when absent or null."""
        v = (self.summary or {}).get(key)
        return NAN if v is None else float(v)

    @property
    def tokens_per_step(self) -> int | None:
        """Tokens per optimizer step: the summary's, else the config's, else None."""
        if isinstance((self.summary or {}).get("tokens_per_step"), int):
            return self.summary["tokens_per_step"]
        keys = ("data.batch_size", "optim.grad_accum", "model.context_length")
        vals = [self.resolved(k) for k in keys]
        return math.prod(vals) if all(isinstance(v, int) for v in vals) else None

    def resolved(self, key: str) -> Any:
        """A config value as the run resolved it (``auto`` -> ``cpp``): summary, else config."""
        s = self.summary or {}
        if key == "norm.impl" and s.get("norm_impl"):
            return s["norm_impl"]
        if key == "precision.dtype" and s.get("precision"):
            return s["precision"]
        return flatten(s.get("config") or {}).get(key, self.config.get(key))


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> ``{"optim.lr": 0.0006, ...}``; lists stay values."""
    if not isinstance(cfg, dict):
        return {prefix: cfg} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def override_key(override: str) -> str:
    """The key an override sets: ``"+optim.lr=1e-3"`` -> ``"optim.lr"``, ``a/b=c`` -> ``a.b``."""
    return override.split("=", 1)[0].lstrip("+~").split("@", 1)[0].replace("/", ".")


def exclusion_reason(summary: dict[str, Any] | None) -> str | None:
    """Why a run is left out of the statistics, or None when it counts."""
    if summary is None:
        return "did not finish (no summary.json)"
    status = summary.get("status")
    if status == "diverged":
        return f"diverged at step {summary.get('diverged_at_step', summary.get('steps_completed'))}"
    if status == "failed":
        return f"failed: {summary.get('error', 'unknown error')}"
    if status == "interrupted":
        return f"interrupted at step {summary.get('interrupted_at_step', '?')}"
    if status != "completed":
        return f"status {status!r}"
    v = summary.get("final_val_loss")
    if v is None or not math.isfinite(float(v)):
        return f"non-finite final validation loss ({v})"
    return None


def never_trained(run: Run) -> str | None:
    """Why ``run`` never trained (no metrics row; summary absent or ``refused``), else None."""
    if run.metrics:
        return None
    if run.summary is None:
        return "never trained (no metrics.jsonl row, no summary.json)"
    if run.summary.get("status") == "refused":
        return f"refused before training: {run.summary.get('error', 'no reason recorded')}"
    return None


def normalise_row(row: dict[str, Any]) -> dict[str, Any]:
    """A ``metrics.jsonl`` row with ``METRIC_RENAMES`` applied (the new name wins a clash)."""
    out = {METRIC_RENAMES.get(k, k): v for k, v in row.items() if k not in METRIC_RENAMES}
    for old, new in METRIC_RENAMES.items():
        if old in row and new not in row:
            out[new] = row[old]
    return out


def read_rows(path: Path) -> list[dict[str, Any]]:
    """JSON objects of ``path``, one a line; bad lines skipped. Raises ReportError: not a regular
    file of at most ``ROWS_MAX_BYTES``."""
    try:
        return files.read_rows(path)
    except (OSError, RunFileError) as e:
        raise ReportError(f"cannot read {path}: {e}") from None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Renamed ``read_rows``. Raises ReportError: no ``step`` row with a known metric."""
    rows = [normalise_row(r) for r in read_rows(path)]
    has_lines = bool(rows) or bool(path.read_bytes().strip())  # read_rows checked its size
    if has_lines and not any("step" in r and any(k in r for k in KNOWN_METRICS) for r in rows):
        names = ", ".join(KNOWN_METRICS) + " (or the old " + ", ".join(METRIC_RENAMES) + ")"
        raise ReportError(f"cannot read {path}: no row has 'step' and one of {names}")
    return rows


def corpus_name_problem(run: Run) -> str | None:
    """Why a held-out corpus name of ``run`` cannot name a figure file, or None."""
    final_eval = (run.summary or {}).get("final_eval")
    names = {str(k) for k in final_eval} if isinstance(final_eval, dict) else set()
    for row in run.metrics:
        for k in row:
            parts = k.split("/")
            if len(parts) == 3 and parts[0] == "val" and parts[2] in ("loss", "bpb"):
                names.add(parts[1])
    bad = sorted(n for n in names if not CORPUS_NAME.fullmatch(n))
    if not bad:
        return None
    return f"held-out corpus name {bad[0]!r} is not a plain name (letters, digits, _ . -)"


def read_yaml(path: Path) -> Any:
    """A run dir's YAML within ``config.files``'s limits, or None. Raises ReportError (one line)."""
    try:
        return load_yaml(path) if path.exists() else None
    except (OSError, RunFileError, yaml.YAMLError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ReportError(f"cannot read {path}: {first}") from None


def _summary(path: Path) -> dict[str, Any] | None:
    """``summary.json``, None if absent or not JSON. Raises ReportError: too big or deep."""
    if not path.exists():
        return None
    try:
        summary = load_json(path)
    except (OSError, RunFileError) as e:
        raise ReportError(f"cannot read {path}: {e}") from None
    except ValueError:
        return None  # a run killed while writing it did not finish
    if not isinstance(summary, dict):
        raise ReportError(f"cannot read {path}: a JSON object was expected")
    return summary


def load_run(path: Path) -> Run:
    """One run dir (config: ``.hydra/config.yaml``, else the summary's). Raises ReportError: a file
    that cannot be read, a held-out corpus name that is not a plain name."""
    overrides = read_yaml(path / ".hydra" / "overrides.yaml") or []
    summary = _summary(path / "summary.json")
    config = read_yaml(path / ".hydra" / "config.yaml")
    if config is None and summary is not None:
        config = summary.get("config")
    metrics = read_metrics(path / "metrics.jsonl") if (path / "metrics.jsonl").exists() else []
    annealed = read_rows(path / ANNEALED_FILE) if (path / ANNEALED_FILE).is_file() else []
    run = Run(
        path,
        [str(o) for o in overrides],
        flatten(config or {}),
        metrics,
        summary,
        excluded=exclusion_reason(summary),
        name=path.name,
        annealed=annealed,
    )
    if (problem := corpus_name_problem(run)) is not None:
        raise ReportError(f"cannot read {path}: {problem}")
    return run


def _natural(p: Path) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]


def is_run_dir(d: Path) -> bool:
    """True when ``d`` holds one of ``RUN_MARKERS``."""
    return any((d / m).exists() for m in RUN_MARKERS)


def find_run_dirs(sweep_dir: Path) -> list[Path]:
    """``sweep_dir`` if a run dir, else its run dirs one or two levels down, in natural order."""
    if is_run_dir(sweep_dir) and not (sweep_dir / "multirun.yaml").exists():
        return [sweep_dir]

    def subdirs(d: Path) -> list[Path]:
        dirs = (p for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
        return sorted(dirs, key=_natural)

    found: list[Path] = []
    for child in subdirs(sweep_dir):
        found += [child] if is_run_dir(child) else [g for g in subdirs(child) if is_run_dir(g)]
    return found


def load_runs(paths: list[str | Path]) -> list[Run]:
    """Every run of ``paths`` (run or sweep dirs, series files, ``<series file>/<i>``), named below
    their common folder. Raises ReportError: a path with no run, an unreadable run or series."""
    dirs: list[Path] = []
    series: dict[Path, tuple[Path, list[int] | None]] = {}
    for p in map(Path, paths):
        if (member := series_member(p)) is not None:
            _add_member(series, *member)
            continue
        if not p.is_dir():
            raise ReportError(f"not a directory nor a series file: {p}")
        found = find_run_dirs(p)
        if not found:
            raise ReportError(f"no run dirs (with .hydra/, summary.json or metrics.jsonl) in {p}")
        dirs += [d for d in found if d.resolve() not in {x.resolve() for x in dirs}]
    runs = [load_run(d) for d in dirs]
    if len(runs) > 1:
        root = Path(os.path.commonpath([d.resolve() for d in dirs]))
        for run in runs:
            run.name = str(run.path.resolve().relative_to(root))
    return runs + _series_runs(series)


# --- series files: what the report reads of each run, stored beside the report -------------------


#: The series file ``normlab-report`` writes beside ``report.md``: gzip-compressed JSON.
SERIES_FILE = "series.json.gz"
SERIES_FORMAT, SERIES_VERSION = "normlab-series", 1
#: The ``metrics.jsonl`` keys a series keeps: these, and every key below one ending in ``/``.
#: Every key the report reads is among them; ``train/lr``, ``train/grad_norm``, ``train/spikes``
#: and the rest are dropped.
SERIES_KEYS = ("step", "train/loss", "val/", "perf/", "downstream/", "diag/")
_SERIES_PREFIXES = tuple(k for k in SERIES_KEYS if k.endswith("/"))
#: Limits on reading one: bytes on disk and once decompressed, and the nesting of its JSON.
SERIES_MAX_BYTES = 64 * 2**20
SERIES_MAX_DEPTH = 32
#: The fields of a stored run and their JSON types.
_RECORD_TYPES = {
    "name": str,
    "overrides": list,
    "config": dict,
    "summary": (dict, type(None)),
    "metrics": list,
    "annealed": list,
}


def series_row(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row with only the ``SERIES_KEYS`` (key order kept)."""
    return {k: v for k, v in row.items() if k in SERIES_KEYS or k.startswith(_SERIES_PREFIXES)}


def series_record(run: Run) -> dict[str, Any]:
    """What a series file stores of ``run``, including why it is excluded or never trained."""
    return {
        "name": run.name,
        "excluded": run.excluded,
        "never_trained": never_trained(run),
        "overrides": run.overrides,
        "config": run.config,
        "summary": run.summary,
        "metrics": [series_row(r) for r in run.metrics],
        "annealed": run.annealed,
    }


def write_atomic(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` by a fsynced ``mkstemp`` file renamed over it (a link is replaced,
    never followed). Raises OSError: the folder cannot be written, or ``path`` is a directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0o022)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)  # as open() would make it, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # a reader never sees half a file
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def write_series(
    path: Path,
    runs: list[Run],
    bench: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
) -> Path:
    """Write the series file of ``runs`` with the bench's JSON and the options (same runs, same
    bytes); returns ``path``. Raises OSError."""
    doc = {
        "format": SERIES_FORMAT,
        "version": SERIES_VERSION,
        "metric_keys": list(SERIES_KEYS),
        "options": options or {},
        "step_bench": bench,
        "runs": [series_record(r) for r in runs],
    }
    data = json.dumps(doc, default=str, separators=(",", ":")).encode()
    return write_atomic(Path(path), gzip.compress(data, compresslevel=9, mtime=0))


def _read_bounded(path: Path) -> bytes:
    """Decompressed bytes of gzip ``path``. Raises ReportError: a link, not regular, too big."""
    mib = f"{SERIES_MAX_BYTES / 2**20:g} MiB"
    if path.is_symlink():
        raise ReportError(f"cannot read {path}: a series file must not be a link")
    try:  # no link followed, no wait on a FIFO
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise ReportError(f"cannot read {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > SERIES_MAX_BYTES:
            raise ReportError(f"cannot read {path}: not a regular file of at most {mib}")
        try:
            with gzip.GzipFile(fileobj=f) as g:
                data = g.read(SERIES_MAX_BYTES + 1)
        except (OSError, EOFError, zlib.error) as e:
            raise ReportError(f"cannot read {path}: not a series file (gzip: {e})") from None
    if len(data) > SERIES_MAX_BYTES:
        raise ReportError(f"cannot read {path}: over {mib} once decompressed")
    return data


def read_series(path: Path) -> dict[str, Any]:
    """The checked series file ``path``. Raises ReportError, one line: a link, not gzip or JSON, too
    big or deep, another format or version, a malformed run."""
    data = _read_bounded(path)
    try:
        doc = json.loads(data)
    except json.JSONDecodeError as e:
        raise ReportError(f"cannot read {path}: {e.msg} (line {e.lineno})") from None
    except RecursionError:
        raise ReportError(f"cannot read {path}: nested deeper than {SERIES_MAX_DEPTH}") from None
    except ValueError:  # bytes that are not UTF-8
        raise ReportError(f"cannot read {path}: not UTF-8 JSON text") from None
    if (problem := series_problem(doc)) is not None:
        raise ReportError(f"cannot read {path}: {problem}")
    return doc


def series_problem(doc: Any) -> str | None:
    """What makes ``doc`` (a parsed series file) unreadable, in a few words, or None."""
    if not isinstance(doc, dict) or doc.get("format") != SERIES_FORMAT:
        return f"not a series file (a JSON object with format {SERIES_FORMAT!r})"
    if doc.get("version") != SERIES_VERSION:
        return f"series version {doc.get('version')!r}: this normlab reads {SERIES_VERSION}"
    if depth(doc) > SERIES_MAX_DEPTH:
        return f"nested deeper than {SERIES_MAX_DEPTH}"
    ok = isinstance(doc.get("runs"), list) and isinstance(doc.get("options", {}), dict)
    if not ok or not isinstance(doc.get("step_bench"), (dict, type(None))):
        return "'runs' must be a list, 'options' an object, 'step_bench' an object or null"
    for i, rec in enumerate(doc["runs"]):
        if (problem := record_problem(rec)) is not None:
            return f"run {i}: {problem}"
    return None


def record_problem(rec: Any) -> str | None:
    """What makes ``rec`` (one stored run) unreadable, or None."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    for key, kind in _RECORD_TYPES.items():
        if not isinstance(rec.get(key), kind):
            return f"{key!r} missing or of the wrong type"
    if not all(isinstance(o, str) for o in rec["overrides"]):
        return "an override that is not a string"
    if not all(isinstance(r, dict) for r in rec["metrics"] + rec["annealed"]):
        return "a metrics or annealed row that is not a JSON object"
    return name_problem(rec["name"])


def name_problem(name: str) -> str | None:
    """Why ``name`` is not a plain relative path below a sweep, or None."""
    parts = name.split("/")
    ok = 0 < len(name) <= 1000 and not any(p in ("", ".", "..") for p in parts)
    if ok and not any(ord(c) < 32 or c in "\\\x7f" for c in name):
        return None
    return f"name {name[:80]!r} is not a relative path below a sweep"


def series_member(p: Path) -> tuple[Path, int | None] | None:
    """``(p, None)`` for a file, ``(file, i)`` for ``<file>/<i>``, else None."""

    def file_or_link(q: Path) -> bool:
        return q.is_file() or (q.is_symlink() and not q.is_dir())

    if file_or_link(p):
        return p, None
    if re.fullmatch(r"[0-9]{1,9}", p.name) and file_or_link(p.parent):
        return p.parent, int(p.name)
    return None


def _add_member(
    series: dict[Path, tuple[Path, list[int] | None]], path: Path, index: int | None
) -> None:
    """Record run ``index`` (None: all) of series file ``path`` in ``series``."""
    key = path.resolve()
    _, have = series.get(key, (path, []))
    if index is None or have is None:
        series[key] = (path, None)
    else:
        series[key] = (path, have + [index] * (index not in have))


def series_run(path: Path, i: int, rec: dict[str, Any]) -> Run:
    """Run ``i`` of series file ``path`` from its record. Raises ReportError: a bad corpus name."""
    run = Run(
        path / str(i),
        list(rec["overrides"]),
        flatten(rec["config"]),
        [normalise_row(r) for r in rec["metrics"]],
        rec["summary"],
        excluded=exclusion_reason(rec["summary"]),
        name=rec["name"],
        annealed=list(rec["annealed"]),
    )
    if (problem := corpus_name_problem(run)) is not None:
        raise ReportError(f"cannot read {path}: run {i}: {problem}")
    return run


def _series_runs(series: dict[Path, tuple[Path, list[int] | None]]) -> list[Run]:
    """The runs asked of each series file, named below their common folder as ``load_runs`` does."""
    runs = []
    for path, wanted in series.values():
        records = read_series(path)["runs"]
        for i in range(len(records)) if wanted is None else wanted:
            if i >= len(records):
                raise ReportError(f"no run {i} in {path}: it holds {len(records)}")
            runs.append(series_run(path, i, records[i]))
    names = [PurePosixPath(r.name) for r in runs]
    if len(runs) == 1:
        runs[0].name = names[0].name
    elif runs:
        root = PurePosixPath(os.path.commonpath([str(n) for n in names]))
        if all(n != root for n in names):
            for run, n in zip(runs, names, strict=True):
                run.name = str(n.relative_to(root))
    return runs


def series_step_bench(src: Path) -> tuple[Path, dict[str, Any]] | None:
    """``(src, bench)``: the bench stored in series file ``src``, or None; raises ReportError."""
    if series_member(src) != (src, None):
        return None
    bench = read_series(src)["step_bench"]
    return None if bench is None else (src, bench)
