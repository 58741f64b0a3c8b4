"""Final validation bits per byte and the held-out corpora (``eval_data``): per variant the final
value of a metric, and its paired difference to the baseline by seed.

Metric keys as ``metrics.jsonl`` writes them: ``val/loss`` (nats/token), ``val/bpb`` (bits/byte),
``val/<name>/loss`` and ``val/<name>/bpb`` for the held-out corpus ``<name>``. Final values come
from ``summary.json`` (``final_val_loss``, ``final_val_bpb``, ``final_eval``), else from the last
finite row of ``metrics.jsonl``; runs written before these keys simply have none.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from normlab.report.runs import NAN, Run
from normlab.report.series import series
from normlab.report.stats import describe, paired_difference

LN2 = math.log(2)


def final_value(run: Run, key: str) -> float:
    """The run's final value of ``key`` (units of the key; nan when the run has none)."""
    s = run.summary or {}
    if key == "val/loss":
        return run.final_val_loss
    v = None
    if key == "val/bpb":
        v = s.get("final_val_bpb")
    elif key.count("/") == 2 and key.startswith("val/"):
        _, name, what = key.split("/")
        entry = (s.get("final_eval") or {}).get(name)
        v = entry.get(what) if isinstance(entry, dict) else None
    if v is not None:
        return float(v)
    _, vals = series(run.metrics, key)
    return float(vals[-1]) if len(vals) else NAN


def heldout_names(runs: list[Run]) -> list[str]:
    """Names of the held-out corpora of ``runs``: ``final_eval``'s keys and ``val/<name>/loss``
    (or ``/bpb``) keys of the metrics, sorted."""
    names: set[str] = set()
    for r in runs:
        final_eval = (r.summary or {}).get("final_eval")
        names |= set(final_eval) if isinstance(final_eval, dict) else set()
        for row in r.metrics:
            for k in row:
                parts = k.split("/")
                if len(parts) == 3 and parts[0] == "val" and parts[2] in ("loss", "bpb"):
                    names.add(parts[1])
    return sorted(names)


def bpb_per_nat(runs: list[Run], loss_key: str = "val/loss", bpb_key: str = "val/bpb") -> float:
    """Median over ``runs`` of final bpb / final loss: 1 / (ln 2 · bytes per token), the factor
    that turns nats/token into bits/byte on that split (nan when no run has both)."""
    r = [final_value(x, bpb_key) / final_value(x, loss_key) for x in runs]
    r = [v for v in r if math.isfinite(v) and v > 0]
    return float(np.median(r)) if r else NAN


def metric_comparison(
    included: dict[str, list[Run]],
    baseline: str,
    key: str,
    margin: float,
    alpha: float,
    unit: str = "nats",
) -> dict[str, Any]:
    """Final ``key`` per variant (``describe`` of the runs that have it) and, per other variant,
    :func:`~normlab.report.stats.paired_difference` of variant − baseline over the seeds where
    both have it, with ``margin`` in the unit of ``key`` (``unit`` names it in the verdict).
    ``included``: label -> runs (baseline among them), each seed at most once per label."""
    out: dict[str, Any] = {"key": key, "margin": margin, "variants": {}, "comparisons": {}}
    finals = {
        lab: {r.seed: final_value(r, key) for r in runs if r.seed is not None}
        for lab, runs in included.items()
    }
    for lab, runs in included.items():
        vals = [final_value(r, key) for r in runs]
        out["variants"][lab] = describe([v for v in vals if math.isfinite(v)])
    base = finals.get(baseline, {})
    for lab, var in finals.items():
        if lab == baseline:
            continue
        seeds = [s for s in sorted(set(var) & set(base), key=str)]
        seeds = [s for s in seeds if math.isfinite(var[s]) and math.isfinite(base[s])]
        diffs = [var[s] - base[s] for s in seeds]
        out["comparisons"][lab] = {"seeds": seeds, **paired_difference(diffs, margin, alpha, unit)}
    return out


def tokenizers(included: dict[str, list[Run]]) -> dict[str, list[str]]:
    """Per label the tokenizers (``data.tokenizer``) of its runs, sorted."""
    return {
        lab: sorted({str(r.resolved("data.tokenizer")) for r in runs})
        for lab, runs in included.items()
    }


def bpb_and_heldout(
    included: dict[str, list[Run]], baseline: str, margin: float, alpha: float
) -> dict[str, Any]:
    """Everything the bpb and held-out sections need.

    Returns ``{"tokenizer_differs": bool, "tokenizers", "bpb": comparison of val/bpb or None,
    "heldout": {name: {"loss": comparison, "bpb": comparison or None}}}``. The bpb margin is
    ``margin`` (nats/token) × :func:`bpb_per_nat` of the baseline's runs on that split: the
    nats margin in bits/byte of the baseline's tokens.
    """
    every = [r for runs in included.values() for r in runs]
    toks = tokenizers(included)
    base = included.get(baseline, [])

    def bpb(loss_key: str, bpb_key: str) -> dict[str, Any] | None:
        if not any(math.isfinite(final_value(r, bpb_key)) for r in every):
            return None
        m = margin * bpb_per_nat(base, loss_key, bpb_key)
        return metric_comparison(included, baseline, bpb_key, m, alpha, "bits/byte")

    heldout = {
        name: {
            "loss": metric_comparison(included, baseline, f"val/{name}/loss", margin, alpha),
            "bpb": bpb(f"val/{name}/loss", f"val/{name}/bpb"),
        }
        for name in heldout_names(every)
    }
    return {
        "tokenizer_differs": len({t for ts in toks.values() for t in ts}) > 1,
        "tokenizers": toks,
        "bpb": bpb("val/loss", "val/bpb"),
        "heldout": heldout,
    }
