"""Reading run dirs and telling their variants apart: find them, load ``.hydra/``,
``metrics.jsonl`` and ``summary.json``, normalise metric names written before the namespaced rename;
then label each run by the keys that differ and change numbers, check that nothing else differs,
choose the baseline, and name the confounds a kind-vs-kind verdict must state.

A run dir is any directory holding ``.hydra/``, ``summary.json`` or ``metrics.jsonl`` (what
``train`` writes). A series file (:data:`SERIES_FILE`, written beside ``report.md``) stores what
the report reads of every run, so the report rebuilds from it alone (:func:`write_series`,
:func:`read_series`). Nothing here imports model or training code. Losses in nats/token, times in
ms.
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import json
import math
import os
import re
import shlex
import stat
import tempfile
import zlib
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from normlab.config import files, norm_table
from normlab.config.files import (
    RunFileError,
    depth,
    load_json,
    load_yaml,
    yaml_text,
)
from normlab.config.schedule import norm_tag
from normlab.report.stats import NAN

RUN_MARKERS = (".hydra", "summary.json", "metrics.jsonl")

#: ``metrics.jsonl`` keys written before the namespaced rename -> their names now. The one place
#: old names are known: :func:`normalise_row` applies it to every row on load.
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
    """One run dir: overrides, flattened config (dotted keys), metrics rows (new names), summary
    (None if absent or unreadable); ``name`` is the path shown in the report."""

    path: Path
    overrides: list[str]
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    summary: dict[str, Any] | None
    label: str = ""
    excluded: str | None = None  # the reason, or None when the run counts in the statistics
    name: str = ""
    #: a completed run left out of the comparison by design (a tuned study's other learning
    #: rates, :func:`normlab.report.compare.choose_best_lr`): the reason, or None
    set_aside: str | None = None
    #: the rows of the run dir's :data:`ANNEALED_FILE` (empty when it has none), as written
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
        """A numeric summary field (units as in ``summary.json``), nan when absent or null."""
        v = (self.summary or {}).get(key)
        return NAN if v is None else float(v)

    @property
    def tokens_per_step(self) -> int | None:
        """Tokens one optimizer step consumes: ``summary.json``'s ``tokens_per_step``, else
        ``data.batch_size * optim.grad_accum * model.context_length`` (as
        ``TrainConfig.tokens_per_step``); None when a key is missing."""
        if isinstance((self.summary or {}).get("tokens_per_step"), int):
            return self.summary["tokens_per_step"]
        keys = ("data.batch_size", "optim.grad_accum", "model.context_length")
        vals = [self.resolved(k) for k in keys]
        return math.prod(vals) if all(isinstance(v, int) for v in vals) else None

    def resolved(self, key: str) -> Any:
        """A config value as the run resolved it (``norm.impl=auto`` -> ``cpp``):
        ``summary.json``'s ``norm_impl`` for ``norm.impl`` (``precision`` for ``precision.dtype``),
        else its resolved ``config``, else ``.hydra/config.yaml``."""
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
    """The config key an override sets: ``"norm=rms"`` -> ``"norm"``, ``"+optim.lr=1e-3"`` ->
    ``"optim.lr"``, ``"hydra/launcher=x"`` -> ``"hydra.launcher"``."""
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
    """Why ``run`` never trained, or None when it did (or may have): a run dir without a single
    ``metrics.jsonl`` row whose ``summary.json`` is absent (killed, or refused by a version that
    wrote no summary, before its first step) or says ``status: refused`` (``train`` refused its
    config before training). Such a dir, which a refused ``train`` leaves under
    ``outputs/runs``, is not a run of the comparison: the report skips it with a note instead
    of making it a variant of its own."""
    if run.metrics:
        return None
    if run.summary is None:
        return "never trained (no metrics.jsonl row, no summary.json)"
    if run.summary.get("status") == "refused":
        return f"refused before training: {run.summary.get('error', 'no reason recorded')}"
    return None


def normalise_row(row: dict[str, Any]) -> dict[str, Any]:
    """One ``metrics.jsonl`` row with old names (:data:`METRIC_RENAMES`) renamed; where a row holds
    both the old and the new name, the new one is kept."""
    out = {METRIC_RENAMES.get(k, k): v for k, v in row.items() if k not in METRIC_RENAMES}
    for old, new in METRIC_RENAMES.items():
        if old in row and new not in row:
            out[new] = row[old]
    return out


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of ``path``, one a line (``metrics.jsonl``, ``annealed.jsonl``), as
    written; blank, truncated (a killed run's last), non-object and too deeply nested lines are
    skipped (:func:`normlab.config.files.read_rows`).

    Raises:
        ReportError: ``path`` is not a regular file of at most ``ROWS_MAX_BYTES``.
    """
    try:
        return files.read_rows(path)
    except (OSError, RunFileError) as e:
        raise ReportError(f"cannot read {path}: {e}") from None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of ``path`` (a ``metrics.jsonl``, :func:`read_rows`) with :func:`normalise_row`
    applied.

    Raises:
        ReportError: the file has lines but no row with ``step`` and a key of :data:`KNOWN_METRICS`
            under its new or old name (not written by ``train``).
    """
    rows = [normalise_row(r) for r in read_rows(path)]
    has_lines = bool(rows) or bool(path.read_bytes().strip())  # read_rows checked its size
    if has_lines and not any("step" in r and any(k in r for k in KNOWN_METRICS) for r in rows):
        names = ", ".join(KNOWN_METRICS) + " (or the old " + ", ".join(METRIC_RENAMES) + ")"
        raise ReportError(f"cannot read {path}: no row has 'step' and one of {names}")
    return rows


def corpus_name_problem(run: Run) -> str | None:
    """Why a held-out corpus name of ``run`` (``summary.json``'s ``final_eval`` keys, the
    ``<name>`` of ``val/<name>/loss`` and ``/bpb`` metrics) cannot name a figure file, or None."""
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


def _yaml(path: Path) -> Any:
    """A run dir's YAML file within the limits of :mod:`normlab.config.files` (None if absent).

    Raises:
        ReportError: one line naming ``path``: not YAML, too big, an alias, too deep.
    """
    try:
        return load_yaml(path) if path.exists() else None
    except (OSError, RunFileError, yaml.YAMLError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ReportError(f"cannot read {path}: {first}") from None


def _summary(path: Path) -> dict[str, Any] | None:
    """``summary.json`` within the limits of :mod:`normlab.config.files`; None when absent or
    not JSON (a version that wrote it in place, killed while writing).

    Raises:
        ReportError: one line naming ``path``: too big, too deep, not an object.
    """
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
    """Read one run dir. Config: ``.hydra/config.yaml``, else ``summary.json``'s ``config``;
    ``annealed``: :data:`ANNEALED_FILE`'s rows, if the dir has one.

    Raises:
        ReportError: a file that is there but cannot be read (see :func:`read_metrics`), or a
            held-out corpus name that is not a plain name (:func:`corpus_name_problem`).
    """
    overrides = _yaml(path / ".hydra" / "overrides.yaml") or []
    summary = _summary(path / "summary.json")
    config = _yaml(path / ".hydra" / "config.yaml")
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
    """True when ``d`` holds one of :data:`RUN_MARKERS`."""
    return any((d / m).exists() for m in RUN_MARKERS)


def find_run_dirs(sweep_dir: Path) -> list[Path]:
    """``sweep_dir`` itself when it is a run dir, else its subdirectories (one or two levels down)
    that are run dirs, in natural order (``2_...`` before ``10_...``)."""
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
    """Load every run named by ``paths``: each a run dir or a sweep dir (see
    :func:`find_run_dirs`), anywhere, a series file (:func:`read_series`), or one run of one
    (``<series file>/<index>``, the :attr:`Run.path` of a run read from a series). A run's ``name``
    is its path below the paths' common folder; a series run's, its stored name below the common
    folder of the loaded series runs' names (one run of it gets the name its run dir would).

    Raises:
        ReportError: a path that is neither a directory nor a series file, one holding no run
            dir, an unreadable run, an unreadable series file (:func:`read_series`).
    """
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


# --- series files: what the report reads of each run, stored beside the report ------------------

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
    """A metrics row with only the :data:`SERIES_KEYS` (key order kept)."""
    return {k: v for k, v in row.items() if k in SERIES_KEYS or k.startswith(_SERIES_PREFIXES)}


def series_record(run: Run) -> dict[str, Any]:
    """What a series file stores of ``run``: its name, overrides, flattened resolved config,
    whole ``summary.json``, metrics rows (:func:`series_row`) and annealed rows; and, for its
    reader, why it is excluded or never trained (recomputed from the summary when read)."""
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
    """Write ``data`` to ``path`` through a temporary file in its folder (created; the file
    ``O_EXCL | O_NOFOLLOW``, by ``mkstemp``), fsynced, then renamed over ``path``: a reader never
    sees half a file, and a link at ``path`` is replaced, never written through.

    Raises:
        OSError: the folder cannot be created or written, or ``path`` is a directory.
    """
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
        os.replace(tmp, path)
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
    """Write the series file of ``runs`` (as :func:`load_runs` gave them, every one: included,
    excluded, never trained) to ``path`` (:func:`write_atomic`): ``format``, ``version``,
    ``metric_keys``, ``options`` (the report's, for its rebuild), ``step_bench`` (the
    interleaved step benchmark's JSON, or null) and ``runs`` (:func:`series_record`). The same
    runs give the same bytes (no time stamp in the gzip header). Returns ``path``.

    Raises:
        OSError: ``path`` cannot be written.
    """
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
    """The decompressed bytes of the gzip file ``path``, refused (:class:`ReportError`) when it
    is a link or not a regular file, or over :data:`SERIES_MAX_BYTES` on disk or decompressed."""
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
    """The series file ``path`` (:func:`write_series`), checked: its ``runs``' fields of the
    right JSON types, names that are relative paths below a sweep (:func:`name_problem`; names
    are never opened), nesting within :data:`SERIES_MAX_DEPTH`, size within
    :data:`SERIES_MAX_BYTES`.

    Raises:
        ReportError: in one line, naming ``path``: a link, not gzip, not JSON, too big or too
            deep, another format or version, a malformed run.
    """
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
    """Why ``name`` is not a run's name below a sweep (``0_norm=rms,seed=0``, ``sweep/3_x``: a
    relative path, no ``.`` or ``..`` part, no control character or backslash), or None."""
    parts = name.split("/")
    ok = 0 < len(name) <= 1000 and not any(p in ("", ".", "..") for p in parts)
    if ok and not any(ord(c) < 32 or c in "\\\x7f" for c in name):
        return None
    return f"name {name[:80]!r} is not a relative path below a sweep"


def series_member(p: Path) -> tuple[Path, int | None] | None:
    """``(p, None)`` when ``p`` is a file or a link that is not a directory (a series file;
    :func:`read_series` refuses a link), ``(file, i)`` for ``<file>/<i>`` (one run of a series
    file), else None."""

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
    """Record run ``index`` (None: every run) of the series file ``path`` in ``series``
    (resolved path -> (path, indices in the order asked, None for all))."""
    key = path.resolve()
    _, have = series.get(key, (path, []))
    if index is None or have is None:
        series[key] = (path, None)
    else:
        series[key] = (path, have + [index] * (index not in have))


def series_run(path: Path, i: int, rec: dict[str, Any]) -> Run:
    """Run ``i`` of the series file ``path`` from its record ``rec`` (checked by
    :func:`record_problem`): the fields :func:`load_run` gives, ``path`` ``<file>/<i>``.

    Raises:
        ReportError: a held-out corpus name that is not a plain name (:func:`corpus_name_problem`).
    """
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
    """The runs asked of each series file (:func:`_add_member`), named below their names'
    common folder (one run: its last part), as :func:`load_runs` names run dirs."""
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
    """The interleaved step benchmark stored in the series file ``src``, with ``src``; None when
    ``src`` is not a whole series file (a run dir, one run of a series) or it stored none (for
    :func:`normlab.report.compare.load_step_bench`, which checks what it holds).

    Raises:
        ReportError: an unreadable series file (:func:`read_series`).
    """
    if series_member(src) != (src, None):
        return None
    bench = read_series(src)["step_bench"]
    return None if bench is None else (src, bench)


# --- variants: labels, comparability, the baseline, confounds ---------------------------------

#: Config keys that change no number the report compares (losses, step times): never a label, never
#: a refusal. A pattern matches the key and every key below it (``logger`` covers ``logger.name``).
#: ``seed`` is apart: it is what runs are paired by.
INERT_KEYS: tuple[str, ...] = (
    "progress",  # the tqdm bar
    "debug",  # tracebacks for user errors
    "logger",  # where metrics are mirrored (wandb project, group, name, mode)
    "peak_tflops",  # only the MFU denominator
    "log_interval",  # how often a metrics row is written
    "timing_warmup_steps",  # which steps the step-time summary leaves out
    "data.cache_dir",  # where the shards are cached (their content is fingerprinted)
    "data.num_proc",  # tokenizer processes
    "ckpt_*",  # checkpoint interval and count
    "max_loss",  # divergence threshold: changes which runs are excluded, which the report lists
    "resume",
    "force",
    "hydra",  # launcher, sweeper, sweep and run dirs
)
#: Implementations that compute every kind the same way (one code path, one fusion), so a
#: kind-vs-kind step time compares kinds. ``torch`` is not among them: PyTorch's F.layer_norm and
#: F.rms_norm are separate kernels, fused differently. An implementation not listed is warned about.
SAME_CODE_FOR_EVERY_KIND = ("reference", "compiled", "triton", "cpp")
#: The settings whose difference between variants confounds a kind-vs-kind comparison.
CONFOUNDS = {
    "norm.impl": "norm implementation",
    "compile": "compile",
    "precision.dtype": "precision",
}


def is_inert(key: str) -> bool:
    """True when ``key`` (dotted) is one of :data:`INERT_KEYS` or lies below one."""
    return any(fnmatch(key, p) or fnmatch(key, p + ".*") for p in INERT_KEYS)


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def _effect(run: Run, key: str, override: str | None) -> str:
    """What the override of ``key`` did to the run: its config under ``key``, else the override's
    value as YAML reads it (``False`` and ``false`` are one value)."""
    sub = {k: v for k, v in run.config.items() if k == key or k.startswith(key + ".")}
    if sub:
        return _canon(sub)
    if override is None:
        return "<unset>"
    return override_value(override) if "=" in override else _canon(override)


def override_value(override: str) -> str:
    """The value of ``key=value`` as YAML reads it, canonical (``False`` and ``false`` are one
    value); its text when YAML refuses it. A run dir's text: no alias expands it
    (:mod:`normlab.config.files`)."""
    value = override.split("=", 1)[1]
    try:
        return _canon(yaml_text(value))
    except (RunFileError, yaml.YAMLError):
        return _canon(value)


def _label_overrides(run: Run, ignore: tuple[str, ...] = ()) -> dict[str, str]:
    keys = {override_key(o): o for o in run.overrides}
    return {k: o for k, o in keys.items() if k != "seed" and k not in ignore and not is_inert(k)}


#: Keys that say where the norms sit (the norm table's ``WHERE_KEYS``, under ``norm.``).
WHERE_KEYS = tuple(f"norm.{k}" for k in norm_table.WHERE_KEYS)


def design_tag(run: Run) -> str:
    """The run's norm design (:func:`normlab.config.schedule.norm_tag` of its resolved config):
    ``rms-peri-qkhead``, ``layer[0-1:rms]-pre``, ..."""
    norm: dict[str, Any] = {}
    for key, v in run.config.items():
        if key.startswith("norm."):
            *path, last = key.removeprefix("norm.").split(".")
            node = norm
            for p in path:
                node = node.setdefault(p, {})
            node[last] = v
    return norm_tag(norm)


def _is_design(keys: set[str]) -> bool:
    """True when the differing keys are norm design keys only, one of them a where-key."""
    where = {k for k in keys if any(k == w or k.startswith(w + ".") for w in WHERE_KEYS)}
    return bool(where) and keys - where <= {"norm", "norm.kind"}


def label_runs(runs: list[Run], ignore: tuple[str, ...] = ()) -> list[str]:
    """Set each run's ``label``; returns the overrides left out of every label (sorted).

    Label: the run's overrides of keys whose effect (:func:`_effect`) differs between runs, sorted
    and joined by ","; ``seed``, :data:`INERT_KEYS` and the keys of ``ignore`` (a tuned study's
    ``optim.lr``: one variant spans its learning rates) never label. When the differing keys are
    where the norms sit (:data:`WHERE_KEYS`, with or without the kind): the design tag
    (:func:`design_tag`, e.g. ``rms-peri-qkhead``). When none is left:
    ``"{norm.kind}/{norm.impl}"`` (plus the design tag when it is not plain pre-norm).
    """
    own = [_label_overrides(r, ignore) for r in runs]
    keys = sorted(set().union(*own))
    differ = {
        k
        for k in keys
        if len({_effect(r, k, o.get(k)) for r, o in zip(runs, own, strict=True)}) > 1
    }
    design = _is_design(differ)
    for run, ovr in zip(runs, own, strict=True):
        kind, tag = run.config.get("norm.kind"), design_tag(run)
        fallback = f"{kind}/{run.config.get('norm.impl')}"
        fallback += "" if tag == f"{kind}-pre" else f" {tag}"
        label = ",".join(sorted(o for k, o in ovr.items() if k in differ))
        run.label = tag if design else label or fallback
    return sorted({o for ovr in own for k, o in ovr.items() if k not in differ})


def _same(va: Any, vb: Any) -> bool:
    nan = isinstance(va, float) and isinstance(vb, float) and math.isnan(va) and math.isnan(vb)
    return va == vb or nan


#: Config groups whose files are ``# @package _global_`` (experiment/, design/, ladder/): a file
#: of one may set any key, so a differing override of one explains every key, as ``norm=rms``
#: explains ``norm.*`` (a test keeps this list equal to the conf dir's).
GLOBAL_GROUPS = ("design", "experiment", "ladder")


def differences(a: Run, b: Run) -> list[str]:
    """Config keys where ``a`` and ``b`` differ that no differing override explains, as
    ``"key (va vs vb)"``; ``seed`` and :data:`INERT_KEYS` are skipped. An override of a key, or of
    a group, explains the key and every key under it; one of a :data:`GLOBAL_GROUPS` group
    (``design=deepnorm``) explains every key."""
    swept = {override_key(o) for o in set(a.overrides) ^ set(b.overrides)}
    if swept & set(GLOBAL_GROUPS):
        return []
    out = []
    for k in sorted(set(a.config) | set(b.config)):
        if k == "seed" or is_inert(k) or any(k == s or k.startswith(s + ".") for s in swept):
            continue
        va, vb = a.config.get(k, "<missing>"), b.config.get(k, "<missing>")
        if not _same(va, vb):
            out.append(f"{k} ({va} vs {vb})")
    return out


def check_comparable(runs: list[Run]) -> None:
    """Raise :class:`ReportError` if runs differ in a config key their overrides do not explain.

    A key is explained by an override that differs between the two runs when it equals the
    override's key or lies under it (``norm=rms`` explains ``norm.*``). Each run is checked against
    its variant's first run, and those first runs pairwise.
    """
    firsts: dict[str, Run] = {}
    with_config = [r for r in runs if r.config]
    pairs = [(firsts.setdefault(r.label, r), r) for r in with_config]
    reps = list(firsts.values())
    pairs += [(reps[i], reps[j]) for i in range(len(reps)) for j in range(i + 1, len(reps))]
    for a, b in pairs:
        diff = differences(a, b) if a is not b else []
        if diff:
            more = f" and {len(diff) - 5} more" if len(diff) > 5 else ""
            where = f"({a.name} vs {b.name})"
            raise ReportError(f"runs differ in keys not swept: {', '.join(diff[:5])}{more} {where}")


def choose_baseline(runs: list[Run], requested: str | None = None) -> str:
    """``requested`` (order of its comma-separated overrides ignored), else ``layer-pre`` (design
    labels), else the one variant whose ``norm.kind`` is ``layer``, else the first label sorted.

    Raises:
        ReportError: ``requested`` is not a variant's label.
    """
    labels = sorted({r.label for r in runs})
    if requested is None and "layer-pre" in labels:  # design labels: pre-norm LayerNorm
        return "layer-pre"
    if requested is not None:
        match = [lab for lab in labels if set(lab.split(",")) == set(requested.split(","))]
        if not match:
            raise ReportError(
                f"baseline {requested!r} is not a variant of these runs: {', '.join(labels)}"
            )
        return match[0]
    layer = sorted({r.label for r in runs if r.config.get("norm.kind") == "layer"})
    return layer[0] if len(layer) == 1 else labels[0]


def _left_out(labels: list[str]) -> str:
    """The warning that the confound checks leave out ``labels`` (variants with no included run)."""
    each = ", ".join(f"`{lab}`" for lab in labels)
    settings = ", ".join(CONFOUNDS.values())
    return (
        f"the checks that the variants agree in {settings} leave out {each}: no included run "
        "(see Excluded runs), so no value to compare"
    )


def confounds(runs: list[Run], labels: list[str]) -> list[str]:
    """One warning per setting of :data:`CONFOUNDS` whose resolved value differs between the
    variants ``labels`` (``norm.impl`` as the run resolved it, see :meth:`Run.resolved`), and one
    when variants of different ``norm.kind`` use an implementation outside
    :data:`SAME_CODE_FOR_EVERY_KIND`. A label with no run in ``runs`` has no value to differ
    in: it is left out of the checks, and one warning names it."""
    by_label = {lab: [r for r in runs if r.label == lab] for lab in labels}
    empty = [lab for lab, rs in by_label.items() if not rs]
    by_label = {lab: rs for lab, rs in by_label.items() if rs}
    out = [_left_out(empty)] if empty else []
    for key, what in CONFOUNDS.items():
        values = {lab: sorted({str(r.resolved(key)) for r in rs}) for lab, rs in by_label.items()}
        if len({tuple(v) for v in values.values()}) > 1:
            each = "; ".join(f"`{lab}`: {'/'.join(v)}" for lab, v in values.items())
            out.append(
                f"the variants differ in {what} ({key}: {each}): the differences below include "
                f"the {what}'s effect, not only the swept setting's"
            )
    kinds = {str(r.config.get("norm.kind")) for r in runs if r.label in by_label}
    impls = sorted({str(r.resolved("norm.impl")) for r in runs if r.label in by_label})
    other = [i for i in impls if i not in SAME_CODE_FOR_EVERY_KIND]
    if len(kinds) > 1 and other:
        out.append(
            f"norm.impl={'/'.join(other)} does not compute every kind with the same code "
            "(PyTorch's F.layer_norm and F.rms_norm are separate kernels, fused differently): "
            "step times compare implementations as much as kinds; for a kind-vs-kind speed "
            "verdict use "
            f"norm.impl={' or '.join(SAME_CODE_FOR_EVERY_KIND)}"
        )
    return out


# --- an unfinished sweep: the jobs its own record lists ------------------------------------------

#: A sweep record (``multirun.yaml``) that lists more jobs than this is not expanded.
MAX_SWEEP_JOBS = 10_000
#: The statuses of a run that ended, whatever its outcome; a job whose run dir has none of them
#: (no ``summary.json``, ``running``, ``interrupted``) did not finish: killed, or still running.
ENDED = ("completed", "diverged", "failed", "refused")
#: Overrides the command that continues a sweep sets itself (:func:`continue_command`).
CONTINUE_SETS = ("resume", "hydra.sweep.dir", "hydra.mode")


def split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets, parentheses and quotes, as Hydra's
    grammar splits a sweep (``a,[b,c]`` -> ``a``, ``[b,c]``); each part stripped."""
    parts, level, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            level += 1
        elif ch in ")]}":
            level -= 1
        elif ch == "," and level == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return [*parts, text[start:].strip()]


def sweep_values(value: str) -> list[str] | None:
    """The values an override's ``value`` sweeps as Hydra's BasicSweeper expands them: a comma
    list, ``choice(...)``, ``range(start, stop[, step])`` of ints; else the one value. None for
    a sweep this does not expand (``glob``, ``interval``, ``sort``, ``shuffle``, a float range)
    or one of more than :data:`MAX_SWEEP_JOBS` values."""
    call = re.fullmatch(r"(\w+)\((.*)\)", value.strip(), re.S)
    if call is None:
        return split_top(value)
    if call[1] == "choice":
        return split_top(call[2])
    if call[1] != "range":
        return None
    try:
        values = range(*(int(a) for a in split_top(call[2])))
    except (TypeError, ValueError):
        return None
    return [str(x) for x in values] if len(values) <= MAX_SWEEP_JOBS else None


def _at(node: Any, *keys: str) -> Any:
    """``node[k1][k2]...`` through dicts only; None where a level is missing or not a dict."""
    for k in keys:
        node = node.get(k) if isinstance(node, dict) else None
    return node


def sweep_record(sweep_dir: Path) -> dict[str, Any] | None:
    """What the sweep's own record (``multirun.yaml``, written by Hydra when the sweep starts)
    says of its jobs: ``task`` and ``hydra``, its command line's overrides; ``jobs``, each job's
    overrides, in the order of Hydra's job numbers (BasicSweeper's: one slot per key,
    ``hydra.sweeper.params`` first and the command line after, a key given again replacing its
    slot's values, the last slot varying fastest); ``swept``, the keys with more than one value.
    None without a record listing ``hydra.overrides.task``, or with a sweep this does not
    expand (:func:`sweep_values`).

    Raises:
        ReportError: ``multirun.yaml`` cannot be read (:mod:`normlab.config.files`' limits).
    """
    hydra = _at(_yaml(sweep_dir / "multirun.yaml"), "hydra")
    task, params = _at(hydra, "overrides", "task"), _at(hydra, "sweeper", "params") or {}
    if not isinstance(task, list) or not isinstance(params, dict):
        return None
    slots: dict[str, list[str]] = {}
    for o in [f"{k}={v}" for k, v in params.items()] + [str(o) for o in task]:
        key, eq, value = o.partition("=")
        values = sweep_values(value) if eq else [None]
        if values is None:
            return None
        slots[key] = [o if v is None else f"{key}={v}" for v in values]
    if math.prod(len(v) for v in slots.values()) > MAX_SWEEP_JOBS:
        return None
    own = _at(hydra, "overrides", "hydra")
    return {
        "task": [str(o) for o in task],
        "hydra": [str(o) for o in own] if isinstance(own, list) else [],
        "jobs": [list(job) for job in itertools.product(*slots.values())],
        "swept": [override_key(k) for k, v in slots.items() if len(v) > 1],
    }


def hydra_quoted(value: str) -> str:
    """``value`` as one value of Hydra's override grammar: bare when it is a plain path, else
    single-quoted, quotes escaped and backslashes doubled only where they precede a quote or
    the end (as ``train``'s command line quotes a path)."""
    if re.fullmatch(r"[\w/.+-]+", value, re.ASCII):
        return value
    body = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value)
    return f"'{body}'"


def continue_command(sweep_dir: Path, record: dict[str, Any]) -> tuple[str, list[str]]:
    """The shell command that continues the sweep in ``sweep_dir``, and the overrides of its
    record left out of it. The command: ``train -m`` with the sweep's own overrides (its record's
    command line, :func:`sweep_record`), ``hydra.sweep.dir`` set to ``sweep_dir`` (absolute) and
    ``resume=auto``, with which a job that completed does nothing, one that was stopped
    continues from its checkpoint and one that never started starts. Left out: overrides that
    name a ``_target_`` (code Hydra would import: a run dir is data) or hold a control
    character."""
    given = [o for o in record["task"] + record["hydra"] if override_key(o) not in CONTINUE_SETS]
    kept = [o for o in given if "_target_" not in o and o.isprintable()]
    where = f"hydra.sweep.dir={hydra_quoted(str(sweep_dir.resolve()))}"
    words = ["train", "-m", *kept, where, "resume=auto"]
    return " ".join(shlex.quote(w) for w in words), [o for o in given if o not in kept]


def job_value(override: str) -> str:
    """The value of ``key=value`` as a job's record compares: a number as a float (Hydra writes a
    swept ``1e-3`` into the job's ``overrides.yaml`` as ``0.001``), else :func:`override_value`."""
    try:
        return _canon(float(override.split("=", 1)[1]))
    except ValueError:
        return override_value(override)


def _why_unfinished(run: Run) -> str:
    """Why a job's run did not finish, in a few words."""
    status = (run.summary or {}).get("status")
    if run.summary is None:
        return "no summary.json"
    if status == "interrupted":
        return f"interrupted at step {run.summary.get('interrupted_at_step', '?')}"
    return f"status {status!r}: killed, or still running"


def unfinished_sweep(sweep_dir: Path, runs: list[Run]) -> dict[str, Any] | None:
    """The jobs of the sweep in ``sweep_dir`` (:func:`sweep_record`) that never started (no run
    dir of ``runs`` below it has the job's swept overrides) or did not finish (its run has no
    status of :data:`ENDED`), and the command that continues the sweep
    (:func:`continue_command`); None when every job ended or the record lists no jobs.

    Returns:
        ``dir``, ``jobs`` (how many the record lists), ``never_started`` and ``unfinished``
        (``(job number, its swept overrides, why)``, Hydra's numbers from 0), ``command``,
        ``left_out`` (overrides the command leaves out).

    Raises:
        ReportError: ``multirun.yaml`` cannot be read.
    """
    record = sweep_record(sweep_dir)
    if record is None:
        return None
    root = sweep_dir.resolve()
    own = [
        (r, {override_key(o): job_value(o) for o in r.overrides if "=" in o})
        for r in runs
        if root in r.path.resolve().parents
    ]
    never, unfinished = [], []
    for num, job in enumerate(record["jobs"]):
        swept = [o for o in job if override_key(o) in record["swept"]]
        want = {override_key(o): job_value(o) for o in swept}
        run = next((r for r, got in own if all(got.get(k) == v for k, v in want.items())), None)
        if run is None:
            never.append((num, " ".join(swept), "never started"))
        elif (run.summary or {}).get("status") not in ENDED:
            unfinished.append((num, " ".join(swept), _why_unfinished(run)))
    if not never and not unfinished:
        return None
    command, left_out = continue_command(sweep_dir, record)
    return {
        "dir": sweep_dir,
        "jobs": len(record["jobs"]),
        "never_started": never,
        "unfinished": unfinished,
        "command": command,
        "left_out": left_out,
    }
