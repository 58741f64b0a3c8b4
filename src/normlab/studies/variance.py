"""``normlab-study variance``: where the paired variance of the final validation loss comes from,
and what each protocol costs to resolve a margin.

A cell is two sweeps of the same seeds (variant A, variant B). Each run's checkpoints are scored
on the fixed validation batches: the newest one ("raw") and the uniform average of the newest
``average`` ones ("avg"), batch by batch, so every evaluation-token count up to ``batches`` comes
from one pass. Annealed points (``optim.anneal_at``) are read from the runs' summaries. The
per-run losses go to ``variance.json``, from which ``--from`` rebuilds the table.
Why: docs/experiments.md "Where the variance comes from".
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import torch

from normlab.config import DataConfig
from normlab.data.tokens import BatchSampler, prepare
from normlab.report.runs import find_run_dirs
from normlab.report.runs import load_run as read_run
from normlab.report.stats import seeds_needed
from normlab.studies.common import md_table
from normlab.training.checkpoint import CKPT_DIR, list_checkpoints, load_checkpoint
from normlab.training.sample import build_section, load_run

BATCHES = (5, 10, 20, 40, 80)  # evaluation batches scored per run (prefixes of batches 0..79)
AVERAGE = 4  # checkpoints in the average


@torch.no_grad()
def batch_losses(model: torch.nn.Module, sampler: BatchSampler, n: int) -> list[float]:
    """Mean cross-entropy (nats/token) of each fixed validation batch ``0..n-1``."""
    model.eval()
    return [float(model(*sampler.val_batch(i))[1]) for i in range(n)]


def averaged_weights(paths: list[Path]) -> dict[str, torch.Tensor]:
    """The uniform average (in float64, cast back) of the checkpoints' model weights."""
    states = [load_checkpoint(p)["model"] for p in paths]
    return {
        k: (sum(s[k].double() for s in states) / len(states)).to(v.dtype)
        for k, v in states[0].items()
    }


def score_run(run_dir: Path, n_batches: int, average: int) -> dict[str, Any]:
    """``{"seed", "raw", "avg", "avg_steps", "annealed", "wall_s"}`` of one run dir: per-batch
    losses of its newest checkpoint and of the average of its newest ``average`` checkpoints."""
    summary = read_run(run_dir).summary or {}  # read with the report's limits
    config = summary["config"]
    trained = load_run(run_dir, device="cpu")
    data = prepare(build_section(DataConfig, "data", config["data"]))
    ctx = config["model"]["context_length"]
    sampler = BatchSampler(data, config["data"]["batch_size"], ctx, 0, torch.device("cpu"))
    raw = batch_losses(trained.model, sampler, n_batches)
    newest = list_checkpoints(run_dir / CKPT_DIR)[:average]
    if len(newest) < average:
        raise ValueError(
            f"{run_dir} keeps {len(newest)} checkpoints, not the {average} to average: train it "
            f"with ckpt_keep={average} and a ckpt_interval a few steps apart, or lower --average"
        )
    trained.model.load_state_dict(averaged_weights([p for _, p in newest]))
    return {
        "run": run_dir.name,
        "seed": summary["seed"],
        "final_val_loss": summary["final_val_loss"],
        "raw": raw,
        "avg": batch_losses(trained.model, sampler, n_batches),
        "avg_steps": [s for s, _ in newest],
        "annealed": {str(a["budget_steps"]): a["val_loss"] for a in summary.get("annealed") or []},
        "wall_s": summary["wall_time_s"],
        "steps": summary["steps_done"],
    }


def score_cell(a_dir: Path, b_dir: Path, n_batches: int, average: int) -> dict[str, list]:
    """``{"a": [...], "b": [...]}``: ``score_run`` of every run dir of each sweep dir."""
    dirs = {
        k: [p for p in find_run_dirs(d) if (p / "summary.json").is_file()]
        for k, d in (("a", a_dir), ("b", b_dir))
    }
    return {k: [score_run(p, n_batches, average) for p in ps] for k, ps in dirs.items()}


def _readings(run: dict[str, Any]) -> dict[str, float]:
    """Every reading of a run: raw and avg at each batch count, and each annealed budget."""
    out = {}
    for kind in ("raw", "avg"):
        for nb in BATCHES:
            if nb <= len(run[kind]):
                out[f"{kind}, {nb} batches"] = statistics.fmean(run[kind][:nb])
    out |= {f"annealed at {t} steps": v for t, v in run["annealed"].items()}
    return out


def cell_rows(name: str, cell: dict[str, list], margin: float) -> list[list[Any]]:
    """Table rows of one cell: per reading, pairs, mean and std of B − A, minutes a run, seeds
    and CPU-hours a fixed-n TOST at ±margin needs for 80% power."""
    a = {r["seed"]: r for r in cell["a"]}
    b = {r["seed"]: r for r in cell["b"]}
    seeds = sorted(set(a) & set(b))
    run_min = statistics.median(r["wall_s"] / r["steps"] for r in cell["a"] + cell["b"]) / 60
    ra = {s: _readings(a[s]) for s in seeds}
    rb = {s: _readings(b[s]) for s in seeds}
    rows = []
    for reading in ra[seeds[0]]:
        diffs = [rb[s][reading] - ra[s][reading] for s in seeds]
        std = statistics.stdev(diffs)
        budget = int(reading.split()[2]) if reading.startswith("annealed") else a[seeds[0]]["steps"]
        minutes = run_min * budget  # a run of this reading's budget, at the cell's time a step
        need = seeds_needed(std, margin)
        hours = need * 2 * minutes / 60 if need else math.nan
        rows.append(
            [
                name,
                reading,
                len(seeds),
                f"{statistics.fmean(diffs):+.4f}",
                f"{std:.4f}",
                f"{minutes:.1f}",
                need or "more than 100000",
                f"{hours:.1f}",
            ]
        )
    return rows


def table(cells: dict[str, dict[str, list]], margin: float) -> str:
    """The markdown table of every cell (``cell_rows``)."""
    header = [
        "cell",
        "reading",
        "pairs",
        "mean B−A",
        "paired std",
        "min a run",
        f"seeds for ±{margin:g}",
        "CPU-hours",
    ]
    return md_table(
        header, [row for name, cell in cells.items() for row in cell_rows(name, cell, margin)]
    )
