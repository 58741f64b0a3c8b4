"""Bits per byte and the held-out corpora (``eval_data``): loss and bpb per variant, paired by seed
with a TOST at the report's margin; their sections and ``val_<corpus>.png``.

Why: docs/reports.md
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from normlab.report.paired import (
    Report,
    comparison_rows,
    final_value,
    metric_comparison,
    variant_rows,
)
from normlab.report.plots import plot_val_loss
from normlab.report.runs import Run
from normlab.report.stats import finite_median
from normlab.report.text import ci_name, figure_lines, fmt, method, table


def heldout_names(runs: list[Run]) -> list[str]:
    """Held-out corpus names of ``runs`` (``final_eval`` and ``val/<name>/...`` keys), sorted."""
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
    """Median final bpb / final loss over ``runs``: 1 / (ln 2 · bytes per token), or nan."""
    r = [final_value(x, bpb_key) / final_value(x, loss_key) for x in runs]
    return finite_median([v for v in r if v > 0])


def tokenizers(included: dict[str, list[Run]]) -> dict[str, list[str]]:
    """Per label the tokenizers (``data.tokenizer``) of its runs, sorted."""
    return {
        lab: sorted({str(r.resolved("data.tokenizer")) for r in runs})
        for lab, runs in included.items()
    }


def bpb_and_heldout(
    included: dict[str, list[Run]], baseline: str, margin: float, alpha: float
) -> dict[str, Any]:
    """``tokenizer_differs``, ``tokenizers``, ``bpb``, per corpus ``heldout[name]["loss"/"bpb"]``;
    bpb margin: ``margin`` × the baseline's ``bpb_per_nat``."""
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


def tokenizer_warning(heldout: dict[str, Any]) -> str | None:
    """The warning when the variants differ in tokenizer, else None."""
    if not heldout["tokenizer_differs"]:
        return None
    each = "; ".join(f"`{k}`: {'/'.join(v)}" for k, v in heldout["tokenizers"].items())
    return (
        f"the variants differ in tokenizer (data.tokenizer: {each}): losses in nats/token "
        "do not compare between them; read the verdict in bits per byte"
    )


# --- the sections and the figures ----------------------------------------------------------------


def render_bpb(rep: Report) -> list[str]:
    """``## Bits per byte``: bpb per variant and the paired verdict; nothing without ``val/bpb``."""
    h = rep.heldout
    b = h.get("bpb")
    if not b:
        return []
    conf = ci_name(rep.alpha)
    lead = (
        "**The variants use different tokenizers: this is the verdict to read** (nats/token "
        "count different tokens). "
        if h["tokenizer_differs"]
        else ""
    )
    return [
        "",
        "## Bits per byte (validation split)",
        "",
        f"{lead}The margin ±{rep.margin:g} nats is ±{fmt(b['margin'], '.4g')} bits/byte on the "
        f"baseline's tokens; paired by seed, variant − `{rep.baseline}`. "
        + method("bits-per-byte-and-held-out-corpora"),
        "",
        *table(["variant", "n", "mean bpb", "std"], variant_rows(b)),
        "",
        *table(["variant", "n", "mean diff (bits/byte)", conf, "verdict"], comparison_rows(b)),
    ]


def render_heldout(rep: Report) -> list[str]:
    """A ``## Held-out corpus`` section per corpus: loss, bpb, paired verdicts, its figure."""
    out: list[str] = []
    conf = ci_name(rep.alpha)
    for name, h in rep.heldout.get("heldout", {}).items():
        loss, bpb = h["loss"], h["bpb"]
        rows = [
            [*row, fmt(bpb["variants"][row[0].strip("`")]["mean"]) if bpb else "n/a"]
            for row in variant_rows(loss)
        ]
        out += [
            "",
            f"## Held-out corpus `{name}` (`val/{name}/loss`, `val/{name}/bpb`)",
            "",
            "Final values; paired by seed, variant − baseline, margin as for the validation "
            "split. " + method("bits-per-byte-and-held-out-corpora"),
            "",
            *table(["variant", "n", "mean loss", "std", "mean bpb"], rows),
            "",
            *table(["variant", "n", "loss diff", conf, "verdict"], comparison_rows(loss)),
        ]
        if bpb:
            out += [
                "",
                *table(["variant", "n", "bpb diff", conf, "verdict"], comparison_rows(bpb)),
            ]
        title = f"Held-out corpus {name}: validation loss vs step"
        caption = f"{title}: mean over seeds, band min–max."
        out += ["", *figure_lines(rep.figures, {f"val_{name}": (title, caption)})]
    return out


def heldout_figures(rep: Report, out_dir: Path) -> dict[str, Path | None]:
    """``val_<name>.png`` per held-out corpus of ``rep`` into ``out_dir`` (key ``val_<name>``)."""
    metrics = {lab: [r.metrics for r in rep.included(lab)] for lab in rep.labels}
    return {
        f"val_{name}": plot_val_loss(metrics, out_dir / f"val_{name}.png", corpus=name)
        for name in rep.heldout.get("heldout", {})
    }
