"""An unfinished sweep: the jobs its ``multirun.yaml`` lists that never started or did not finish,
and the command that continues the sweep.

Why: docs/reports.md
"""

from __future__ import annotations

import itertools
import math
import re
import shlex
from pathlib import Path
from typing import Any

from normlab.report.paired import Report
from normlab.report.runs import Run, override_key, read_yaml
from normlab.report.variants import canon, override_value

#: A sweep record (``multirun.yaml``) that lists more jobs than this is not expanded.
MAX_SWEEP_JOBS = 10_000
#: The statuses of a run that ended, whatever its outcome; a job whose run dir has none of them
#: (no ``summary.json``, ``running``, ``interrupted``) did not finish: killed, or still running.
ENDED = ("completed", "diverged", "failed", "refused")
#: Overrides the command that continues a sweep sets itself (``continue_command``).
CONTINUE_SETS = ("resume", "hydra.sweep.dir", "hydra.mode")


def split_top(text: str) -> list[str]:
    """``text`` split at top-level commas, as Hydra splits ``a,[b,c]`` into ``a``, ``[b,c]``."""
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
    """The values an override sweeps as Hydra's BasicSweeper expands it (list, ``choice``,
    ``range``); None for another sweep or over ``MAX_SWEEP_JOBS``."""
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
    """``node[k1][k2]...`` through dicts only, else None."""
    for k in keys:
        node = node.get(k) if isinstance(node, dict) else None
    return node


def sweep_record(sweep_dir: Path) -> dict[str, Any] | None:
    """``task``, ``hydra``, ``jobs`` (in job order), ``swept`` of ``multirun.yaml``, or None. Raises
    ReportError: unreadable."""
    hydra = _at(read_yaml(sweep_dir / "multirun.yaml"), "hydra")
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
    """``value`` as one Hydra override value, quoted as ``train``'s command line quotes a path."""
    if re.fullmatch(r"[\w/.+-]+", value, re.ASCII):
        return value
    body = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value)
    return f"'{body}'"


def continue_command(sweep_dir: Path, record: dict[str, Any]) -> tuple[str, list[str]]:
    """``train -m ... resume=auto`` that continues the sweep, and the overrides it leaves out
    (``_target_``, control characters)."""
    given = [o for o in record["task"] + record["hydra"] if override_key(o) not in CONTINUE_SETS]
    kept = [o for o in given if "_target_" not in o and o.isprintable()]
    where = f"hydra.sweep.dir={hydra_quoted(str(sweep_dir.resolve()))}"
    words = ["train", "-m", *kept, where, "resume=auto"]
    return " ".join(shlex.quote(w) for w in words), [o for o in given if o not in kept]


def job_value(override: str) -> str:
    """The value of ``key=value`` as a job's record compares it: numbers as floats."""
    try:
        # Hydra writes a swept 1e-3 into the job's overrides.yaml as 0.001
        return canon(float(override.split("=", 1)[1]))
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
    """``dir``, ``jobs``, ``never_started``, ``unfinished``, ``command``, ``left_out``; None when
    every job ended. Raises ReportError: ``multirun.yaml`` cannot be read."""
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


def unfinished_sweeps(sources: list[Path], runs: list[Run]) -> list[dict[str, Any]]:
    """``unfinished_sweep`` of each source sweep with an unfinished job; ``runs``: every run."""
    found = [unfinished_sweep(src, runs) for src in sources if (src / "multirun.yaml").is_file()]
    return [u for u in found if u is not None]


# --- the section and the lines printed -----------------------------------------------------------


#: At most this many jobs of an unfinished sweep are named in each list; the rest are counted.
JOBS_NAMED = 20


def _jobs(rows: list[tuple[int, str, str]], why: bool, code: bool) -> str:
    """``job N (overrides: why)`` for each of ``rows`` (at most ``JOBS_NAMED``)."""
    q = "`" if code else ""
    named = []
    for num, swept, reason in rows[:JOBS_NAMED]:
        shown = [f"{q}{swept}{q}"] if swept else []
        inner = ": ".join(shown + ([reason] if why else []))
        named.append(f"job {num} ({inner})" if inner else f"job {num}")
    more = f" and {len(rows) - JOBS_NAMED} more" if len(rows) > JOBS_NAMED else ""
    return ", ".join(named) + more


def unfinished_text(u: dict[str, Any], code: bool = True) -> str:
    """One unfinished sweep in one line: jobs listed, ended, unfinished (why), never started."""
    never, unfinished = u["never_started"], u["unfinished"]
    q = "`" if code else ""
    parts = [
        f"its {q}multirun.yaml{q} lists {u['jobs']} jobs (numbered from 0, as its job dirs), "
        f"{u['jobs'] - len(never) - len(unfinished)} ended"
    ]
    if unfinished:
        parts.append(f"{len(unfinished)} did not finish: {_jobs(unfinished, True, code)}")
    if never:
        parts.append(f"{len(never)} never started: {_jobs(never, False, code)}")
    return "; ".join(parts)


def unfinished_notes(rep: Report) -> list[str]:
    """What ``normlab-report`` prints of each unfinished sweep: its jobs and the command."""
    return [
        f"warning: unfinished sweep {u['dir']}: {unfinished_text(u, code=False)}; "
        f"continue it with: {u['command']}"
        for u in rep.unfinished
    ]


def render_unfinished(rep: Report) -> list[str]:
    """``## Unfinished sweep`` per source sweep: which jobs, and the command that continues it."""
    out = []
    for u in rep.unfinished:
        text = unfinished_text(u)
        left = (
            " Left out of the command (they name code to import, or hold control characters): "
            + ", ".join(f"`{o!r}`" for o in u["left_out"])
            + "."
            if u["left_out"]
            else ""
        )
        out += [
            "",
            f"## Unfinished sweep: `{u['dir']}`",
            "",
            f"{text[0].upper()}{text[1:]}. This report holds only the runs that ended. Continue "
            "the sweep with the command below (`resume=auto`: a job that completed does nothing, "
            f"one that was stopped continues from its checkpoint, the others start).{left}",
            "",
            "```",
            u["command"],
            "```",
        ]
    return out
