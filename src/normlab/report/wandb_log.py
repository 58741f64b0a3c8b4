"""The report's tables and figures for a wandb run: the tables as columns and rows (no wandb
needed), where to log them, and the logging.

Why: docs/reports.md
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from normlab.report.paired import Report

Table = tuple[list[str], list[list[Any]]]
MODES = ("offline", "online", "disabled")


def _ci(c: dict[str, Any]) -> list[float]:
    return [float(c["ci"][0]), float(c["ci"][1])]


def report_tables(rep: Report) -> dict[str, Table]:
    """``name -> (columns, rows)`` of every table of the report (nats/token, bits/byte)."""
    cols = ["n", "mean", "std", "min", "max", "step_time_ms", "tokens_per_s"]
    out: dict[str, Table] = {
        "variants": (
            ["variant", *cols],
            [[v["label"], *(v[k] for k in cols)] for v in rep.variants],
        )
    }
    if rep.comparisons:
        out["compute_equivalent"] = _compute_table(rep)
    out["comparisons"] = (
        ["variant", "n", "mean_diff", "ci_lo", "ci_hi", "p_lower", "p_upper", "verdict"],
        [
            [c["label"], c["n"], c["mean"], *_ci(c), c["p_lower"], c["p_upper"], c["verdict"]]
            for c in rep.comparisons
        ],
    )
    if any(c.get("holm") for c in rep.comparisons):
        keys = ["p_tost", "p_tost_holm", "p_diff", "p_diff_holm", "verdict"]
        out["family_holm"] = (
            ["variant", "n", *keys],
            [[c["label"], c["n"], *(c["holm"][k] for k in keys)] for c in rep.comparisons],
        )
    paired = ["variant", "n", "mean_diff", "ci_lo", "ci_hi", "verdict"]
    metrics = {"bpb": rep.heldout.get("bpb")}
    for name, h in rep.heldout.get("heldout", {}).items():
        metrics |= {f"heldout_{name}_loss": h["loss"], f"heldout_{name}_bpb": h["bpb"]}
    for name, comp in metrics.items():
        if comp:
            rows = [
                [lab, c["n"], c["mean"], *_ci(c), c["verdict"]]
                for lab, c in comp["comparisons"].items()
            ]
            out[name] = (paired, rows)
    t = rep.target
    if t and t.get("comparisons"):
        head = ["variant", "target", "what", "n", "gmean_ratio", "ci_lo", "ci_hi"]
        rows = [
            [lab, t["target"], what, r["n"], r["gmean"], *_ci(r)]
            for lab, c in t["comparisons"].items()
            for what, r in c.items()
        ]
        out["time_to_target"] = (head, rows)
    if rep.bench:
        head = ["variant", "pairs", "median_ratio", "gmean_ratio", "ci_lo", "ci_hi"]
        rows = [
            [lab, r["pairs"], r["median"], r["gmean"], *_ci(r)]
            for lab, r in rep.bench["ratios"].items()
            if r
        ]
        out["speed_interleaved"] = (head, rows)
    if rep.tuned:
        head = ["variant", "lr", "n", "mean", "ci_lo", "ci_hi", "best"]
        rows = [
            [lab, lr, p["n"], p["mean"], *_ci(p), rep.tuned["best"].get(lab) == lr]
            for lab, pts in rep.tuned["points"].items()
            for lr, p in pts.items()
        ]
        out["tuned"] = (head, rows)
    return out


def _compute_table(rep: Report) -> Table:
    """The compute-equivalent verdict per variant: k, its CI, n, its step and speed parts."""
    head = ["variant", "n", "k", "ci_lo", "ci_hi", "step_mult", "speed", "speed_source"]
    rows = [
        [c["label"], k["n"], k["k"], *_ci(k), k["step_mult"], k["speed"], k["source"]]
        for c in rep.comparisons
        if (k := c["compute"])
    ]
    return head, rows


def wandb_settings(rep: Report, mode: str | None = None, project: str | None = None) -> dict:
    """``wandb.init`` kwargs: ``mode``, ``project`` (argument, runs' logger config, default),
    ``group``, ``job_type`` ``report``, ``name``."""
    runs = rep.runs

    def shared(key: str) -> Any:
        values = {r.config.get(key) for r in runs}
        return values.pop() if len(values) == 1 else None

    if mode is None:
        mode = shared("logger.mode") if shared("logger.kind") == "wandb" else None
        mode = mode if mode in MODES else "offline"
    group = shared("logger.group") or (rep.sources[0].resolve().name if rep.sources else "report")
    return {
        "mode": mode,
        "project": project or shared("logger.project") or "normlab",
        "group": str(group),
        "job_type": "report",
        "name": f"report-{group}",
    }


def log_report_to_wandb(rep: Report, run: Any = None) -> bool:
    """Log the tables and written figures of ``rep`` to ``run``; False without wandb or a run."""
    if run is None:
        return False
    try:
        import wandb
    except ImportError:
        return False
    data: dict[str, Any] = {
        f"report/{name}": wandb.Table(columns=cols, data=rows)
        for name, (cols, rows) in report_tables(rep).items()
    }
    data.update({f"report/{k}": wandb.Image(str(p)) for k, p in rep.figures.items() if p})
    run.log(data)
    return True
