"""``normlab-report SWEEP_DIR``: compare the variants of a sweep by final validation loss and step time.

A pure reader of run dirs (``.hydra/overrides.yaml``, ``.hydra/config.yaml``, ``metrics.jsonl``,
``summary.json``); it never imports model or training code. Losses are in nats/token, times in ms.
Statistics: Student t confidence intervals for paired per-seed differences, and the two one-sided
tests (TOST) equivalence procedure of Schuirmann (1987) at a margin in nats/token.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy import stats

from normlab.report.sections import render_diagnostics, render_outcome, render_swept

NAN = float("nan")
IGNORED_PREFIXES = ("logger", "hydra")  # config keys never checked for sweep consistency
RUN_MARKERS = (".hydra", "summary.json", "metrics.jsonl")
EMA_BETA = 0.95  # training-loss smoothing in the figure, per logged step


class ReportError(Exception):
    """A sweep that cannot be compared; the message is one line for the user."""


@dataclass
class Run:
    """One run dir: overrides, flattened config (dotted keys), metrics rows, summary (None if absent)."""

    path: Path
    overrides: list[str]
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    summary: dict[str, Any] | None
    label: str = ""
    excluded: str | None = None  # the reason, or None when the run counts in the statistics

    @property
    def seed(self) -> int | None:
        """The run's seed: config ``seed``, else summary ``seed``."""
        return self.config.get("seed", (self.summary or {}).get("seed"))

    @property
    def final_val_loss(self) -> float:
        """Final validation loss in nats/token (nan when absent)."""
        v = (self.summary or {}).get("final_val_loss")
        return NAN if v is None else float(v)

    def summary_float(self, key: str) -> float:
        """A numeric summary field (units as in ``summary.json``), nan when absent or null."""
        v = (self.summary or {}).get(key)
        return NAN if v is None else float(v)


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> ``{"optim.lr": 0.0006, ...}``; lists stay values."""
    if not isinstance(cfg, dict):
        return {prefix: cfg} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def override_key(override: str) -> str:
    """The config key an override sets: ``"norm=rms"`` -> ``"norm"``, ``"+optim.lr=1e-3"`` -> ``"optim.lr"``,
    ``"hydra/launcher=x"`` -> ``"hydra.launcher"``."""
    return override.split("=", 1)[0].lstrip("+~").split("@", 1)[0].replace("/", ".")


def exclusion_reason(summary: dict[str, Any] | None) -> str | None:
    """Why a run is left out of the statistics, or None when it counts."""
    if summary is None:
        return "did not finish (no summary.json)"
    status = summary.get("status")
    if status == "diverged":
        return f"diverged at step {summary.get('diverged_at_step', summary.get('steps_completed', '?'))}"
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


def _natural(p: Path) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]


def find_run_dirs(sweep_dir: Path) -> list[Path]:
    """Subdirectories (one or two levels down) holding ``.hydra/``, ``summary.json`` or ``metrics.jsonl``."""

    def is_run(d: Path) -> bool:
        return any((d / m).exists() for m in RUN_MARKERS)

    def subdirs(d: Path) -> list[Path]:
        return sorted(
            (p for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")), key=_natural
        )

    found: list[Path] = []
    for child in subdirs(sweep_dir):
        found += [child] if is_run(child) else [g for g in subdirs(child) if is_run(g)]
    return found or ([sweep_dir] if is_run(sweep_dir) else [])


def load_run(path: Path) -> Run:
    """Read one run dir. Config: ``.hydra/config.yaml``, else ``summary.json``'s ``config``."""
    hydra = path / ".hydra"
    overrides = (
        yaml.safe_load((hydra / "overrides.yaml").read_text())
        if (hydra / "overrides.yaml").exists()
        else []
    )
    summary = None
    if (path / "summary.json").exists():
        try:
            summary = json.loads((path / "summary.json").read_text())
        except json.JSONDecodeError:
            summary = None  # a run killed while writing it did not finish
    config = (
        yaml.safe_load((hydra / "config.yaml").read_text())
        if (hydra / "config.yaml").exists()
        else None
    )
    if config is None and summary is not None:
        config = summary.get("config")
    metrics = []
    if (path / "metrics.jsonl").exists():
        for line in (path / "metrics.jsonl").read_text().splitlines():
            try:
                metrics.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # blank or truncated last line of a killed run
    return Run(
        path,
        [str(o) for o in overrides or []],
        flatten(config or {}),
        metrics,
        summary,
        excluded=exclusion_reason(summary),
    )


def load_sweep(sweep_dir: str | Path) -> tuple[list[Run], list[str]]:
    """Load every run dir of a sweep and label it; returns ``(runs, common_overrides)``.

    Label: the run's overrides without ``seed=`` and without those every run shares (listed in
    ``common_overrides``), sorted and joined by ","; when none are left, ``"{norm.kind}/{norm.impl}"``.
    """
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise ReportError(f"not a directory: {sweep_dir}")
    runs = [load_run(p) for p in find_run_dirs(sweep_dir)]
    if not runs:
        raise ReportError(
            f"no run dirs (with .hydra/, summary.json or metrics.jsonl) under {sweep_dir}"
        )
    own = [
        [
            o
            for o in r.overrides
            if override_key(o) != "seed" and not override_key(o).startswith("hydra")
        ]
        for r in runs
    ]
    common = sorted(set.intersection(*(set(o) for o in own)))
    for run, ovr in zip(runs, own, strict=True):
        fallback = f"{run.config.get('norm.kind')}/{run.config.get('norm.impl')}"
        run.label = ",".join(sorted(o for o in ovr if o not in common)) or fallback
    return runs, common


def _differences(a: Run, b: Run) -> list[str]:
    """Config keys where ``a`` and ``b`` differ that no differing override explains, as ``"key (va vs vb)"``."""
    swept = {override_key(o) for o in set(a.overrides) ^ set(b.overrides)}
    out = []
    for k in sorted(set(a.config) | set(b.config)):
        if k == "seed" or k.split(".", 1)[0] in IGNORED_PREFIXES:
            continue
        if any(k == s or k.startswith(s + ".") for s in swept):
            continue
        va, vb = a.config.get(k, "<missing>"), b.config.get(k, "<missing>")
        same = va == vb or (
            isinstance(va, float) and isinstance(vb, float) and math.isnan(va) and math.isnan(vb)
        )
        if not same:
            out.append(f"{k} ({va} vs {vb})")
    return out


def check_comparable(runs: list[Run]) -> None:
    """Raise :class:`ReportError` if runs differ in a config key their overrides do not explain.

    A key is explained by an override that differs between the two runs when it equals the override's
    key or lies under it (``norm=rms`` explains ``norm.*``); ``seed``, ``logger.*``, ``hydra.*`` are
    ignored. Each run is checked against its variant's first run, and those first runs pairwise.
    """
    with_config = [r for r in runs if r.config]
    firsts: dict[str, Run] = {}
    pairs = [(firsts.setdefault(r.label, r), r) for r in with_config]
    reps = list(firsts.values())
    pairs += [(reps[i], reps[j]) for i in range(len(reps)) for j in range(i + 1, len(reps))]
    for a, b in pairs:
        diff = _differences(a, b) if a is not b else []
        if diff:
            more = f" and {len(diff) - 5} more" if len(diff) > 5 else ""
            where = f"({a.path.name} vs {b.path.name})"
            raise ReportError(f"runs differ in keys not swept: {', '.join(diff[:5])}{more} {where}")


def choose_baseline(runs: list[Run], requested: str | None = None) -> str:
    """``requested`` (order of its comma-separated overrides ignored), else the one variant whose
    ``norm.kind`` is ``layer``, else the first label sorted."""
    labels = sorted({r.label for r in runs})
    if requested is not None:
        match = [lab for lab in labels if set(lab.split(",")) == set(requested.split(","))]
        if not match:
            raise ReportError(
                f"baseline {requested!r} is not a variant of this sweep: {', '.join(labels)}"
            )
        return match[0]
    layer = sorted({r.label for r in runs if r.config.get("norm.kind") == "layer"})
    return layer[0] if len(layer) == 1 else labels[0]


def describe(values: list[float]) -> dict[str, float]:
    """n, mean, sample std (ddof=1; nan when n < 2), min, max, in the units of ``values``."""
    x = np.asarray(values, float)
    if x.size == 0:
        return {"n": 0, "mean": NAN, "std": NAN, "min": NAN, "max": NAN}
    return {
        "n": int(x.size),
        "mean": float(x.mean()),
        "std": float(x.std(ddof=1)) if x.size > 1 else NAN,
        "min": float(x.min()),
        "max": float(x.max()),
    }


def t_interval(values: list[float], confidence: float) -> tuple[float, float]:
    """Two-sided Student t interval for the mean: mean ± t_{(1+confidence)/2, n-1} · s/√n (units of
    ``values``; s the ddof=1 std). ``(nan, nan)`` when n < 2."""
    x = np.asarray(values, float)
    if x.size < 2:
        return NAN, NAN
    half = stats.t.ppf((1 + confidence) / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean() - half), float(x.mean() + half)


def paired_difference(diffs: list[float], margin: float, alpha: float = 0.05) -> dict[str, Any]:
    """Per-seed differences (variant − baseline, nats/token): n, mean, std, ``ci`` (1−alpha Student t),
    ``ci_tost`` (1−2·alpha), TOST p-values and verdict.

    TOST (Schuirmann 1987): H0₋: μ ≤ −margin, p_lower = P(T_{n−1} ≥ (mean+margin)/se); H0₊: μ ≥ +margin,
    p_upper = P(T_{n−1} ≤ (mean−margin)/se), se = s/√n. Equivalent iff both reject at alpha, i.e. iff
    ``ci_tost`` lies within (−margin, +margin). Verdict: ``"equivalent within {margin} nats"``; else
    ``"different"`` when ``ci`` excludes 0; else ``"not shown equivalent"`` (``"... (n < 2)"``).
    """
    d = describe(diffs)
    out = {**d, "ci": (NAN, NAN), "ci_tost": (NAN, NAN), "p_lower": NAN, "p_upper": NAN}
    if d["n"] < 2:
        return {**out, "verdict": "not shown equivalent (n < 2)"}
    df, se = d["n"] - 1, d["std"] / math.sqrt(d["n"])
    with np.errstate(divide="ignore", invalid="ignore"):  # se = 0: t = ±inf, p = 0 or 1
        out["p_lower"] = float(stats.t.sf(np.float64(d["mean"] + margin) / se, df))
        out["p_upper"] = float(stats.t.cdf(np.float64(d["mean"] - margin) / se, df))
    out["ci"], out["ci_tost"] = t_interval(diffs, 1 - alpha), t_interval(diffs, 1 - 2 * alpha)
    if -margin < out["ci_tost"][0] and out["ci_tost"][1] < margin:
        verdict = f"equivalent within {margin:g} nats"
    elif out["ci"][0] > 0 or out["ci"][1] < 0:
        verdict = "different"
    else:
        verdict = "not shown equivalent"
    return {**out, "verdict": verdict}


def ratio_interval(ratios: list[float], alpha: float = 0.05) -> dict[str, Any]:
    """Per-seed ratios (e.g. step time variant/baseline, dimensionless): n, geometric mean exp(mean log r)
    and its 1−alpha Student t interval computed on log r and exponentiated."""
    logs = np.log(np.asarray(ratios, float))
    lo, hi = t_interval(list(logs), 1 - alpha)
    return {
        "n": int(logs.size),
        "gmean": float(np.exp(logs.mean())) if logs.size else NAN,
        "ci": (math.exp(lo), math.exp(hi)) if logs.size > 1 else (NAN, NAN),
    }


@dataclass
class Report:
    """Everything ``report.md`` says; ``variants`` and ``comparisons`` are lists of row dicts."""

    sweep_dir: Path
    margin: float
    alpha: float
    baseline: str
    runs: list[Run]
    common_overrides: list[str]
    variants: list[dict[str, Any]] = field(default_factory=list)
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, Path | None] = field(default_factory=dict)

    def included(self, label: str) -> list[Run]:
        return [r for r in self.runs if r.label == label and r.excluded is None]


def _median_of(runs: list[Run], key: str) -> float:
    """Median over runs of a summary field (each run's own median step time, tokens/s); nan if none."""
    vals = [x for x in (r.summary_float(key) for r in runs) if math.isfinite(x)]
    return float(np.median(vals)) if vals else NAN


def build_report(
    sweep_dir: str | Path, margin: float = 0.02, alpha: float = 0.05, baseline: str | None = None
) -> Report:
    """Load, check and compare a sweep (no files written); ``margin`` in nats/token.

    Raises :class:`ReportError` on a refusal (see :func:`check_comparable`, :func:`choose_baseline`)
    or when a variant has two completed runs with the same seed (pairing would be ambiguous).
    """
    runs, common = load_sweep(sweep_dir)
    check_comparable(runs)
    base = choose_baseline(runs, baseline)
    rep = Report(Path(sweep_dir), margin, alpha, base, runs, common)
    by_seed: dict[str, dict[Any, Run]] = {}
    for lab in [base] + sorted({r.label for r in runs} - {base}):
        inc = rep.included(lab)
        seeds = [r.seed for r in inc]
        dup = [s for s in seeds if seeds.count(s) > 1]
        if dup:
            raise ReportError(
                f"variant {lab} has two completed runs with seed {dup[0]}; cannot pair by seed"
            )
        by_seed[lab] = {r.seed: r for r in inc if r.seed is not None}
        rep.variants.append(
            {
                "label": lab,
                **describe([r.final_val_loss for r in inc]),
                "excluded": sum(r.label == lab and r.excluded is not None for r in runs),
                "step_time_ms": _median_of(inc, "step_time_ms_median"),
                "tokens_per_s": _median_of(inc, "tokens_per_s"),
            }
        )
    b = by_seed[base]
    for lab, v in list(by_seed.items())[1:]:
        seeds = sorted(set(v) & set(b))
        diffs = [v[s].final_val_loss - b[s].final_val_loss for s in seeds]
        ratios = {
            s: v[s].summary_float("step_time_ms_median") / b[s].summary_float("step_time_ms_median")
            for s in seeds
        }
        ratios = {s: x for s, x in ratios.items() if math.isfinite(x) and x > 0}
        rep.comparisons.append(
            {
                "label": lab,
                "seeds": seeds,
                "diffs": diffs,
                **paired_difference(diffs, margin, alpha),
                "ratio": {**ratio_interval(list(ratios.values()), alpha), "seeds": list(ratios)},
            }
        )
    return rep


def write_report(rep: Report, out_dir: str | Path) -> Path:
    """Write the figures and ``report.md`` into ``out_dir``; returns the path of ``report.md``."""
    from normlab.report.plots import write_figures
    from normlab.report.sections import write_study_figures

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    labels = [v["label"] for v in rep.variants]
    metrics = {lab: [r.metrics for r in rep.included(lab)] for lab in labels}
    times = {
        lab: [
            t
            for r in rep.included(lab)
            for t in (r.summary or {}).get("step_times_ms") or []
            if t is not None
        ]
        for lab in labels
    }
    rep.figures = write_figures(metrics, times, out, EMA_BETA)
    rep.figures.update(write_study_figures(rep, out))
    path = out / "report.md"
    path.write_text(render_markdown(rep))
    return path


def _f(x: Any, spec: str = ".4f") -> str:
    return (
        "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)
    )


def _ci(ci: tuple[float, float], spec: str = "+.4f") -> str:
    return f"[{_f(ci[0], spec)}, {_f(ci[1], spec)}]"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def render_markdown(rep: Report) -> str:
    """The report as Markdown (losses in nats/token, times in ms)."""
    m, a = rep.margin, rep.alpha
    conf, tconf = f"{100 * (1 - a):g}% CI", f"{100 * (1 - 2 * a):g}% CI"
    n_exc = sum(r.excluded is not None for r in rep.runs)
    shared = ", ".join(f"`{o}`" for o in rep.common_overrides) or "none"
    L = [
        "# normlab sweep report",
        "",
        f"- Sweep: `{rep.sweep_dir}`",
        f"- Equivalence margin: ±{m:g} nats/token; alpha = {a:g}",
        f"- Baseline: `{rep.baseline}`",
        f"- Runs: {len(rep.runs)} found, {len(rep.runs) - n_exc} included, {n_exc} excluded",
        f"- Overrides shared by every run (left out of the labels): {shared}",
        "",
        "## Final validation loss per variant",
        "",
        "Loss in nats/token; std is the sample std (ddof=1); step time and tokens/s are medians over runs "
        "of each run's median.",
        "",
    ]
    L += _table(
        ["variant", "n", "excluded", "mean", "std", "min", "max", "step time (ms)", "tokens/s"],
        [
            [
                f"`{v['label']}`",
                v["n"],
                v["excluded"],
                *(_f(v[k]) for k in ("mean", "std", "min", "max")),
                _f(v["step_time_ms"], ".1f"),
                _f(v["tokens_per_s"], ",.0f"),
            ]
            for v in rep.variants
        ],
    )
    L += render_outcome(rep)
    L += ["", f"## Paired difference vs `{rep.baseline}` (variant − baseline, paired by seed)", ""]
    if not rep.comparisons:
        L.append("Only one variant: nothing to compare.")
    else:
        L += [
            f"Student t intervals; equivalence by TOST (Schuirmann 1987): equivalent iff the {tconf} lies within "
            f"±{m:g} nats, i.e. both one-sided t-tests reject at alpha = {a:g}.",
            "",
        ]
        L += _table(
            [
                "variant",
                "n",
                "mean diff",
                "std",
                conf,
                tconf,
                "p (H0: ≤ −margin)",
                "p (H0: ≥ +margin)",
                "verdict",
            ],
            [
                [
                    f"`{c['label']}`",
                    c["n"],
                    _f(c["mean"], "+.4f"),
                    _f(c["std"]),
                    _ci(c["ci"]),
                    _ci(c["ci_tost"]),
                    _f(c["p_lower"], ".3g"),
                    _f(c["p_upper"], ".3g"),
                    c["verdict"],
                ]
                for c in rep.comparisons
            ],
        )
    for c in rep.comparisons:
        seeds = ", ".join(map(str, c["seeds"])) or "none"
        if c["n"] < 2:
            what = (
                f"one seed paired with the baseline ({seeds}): difference {_f(c['mean'], '+.4f')} nats/token"
                if c["n"]
                else "no seed where both completed: nothing to pair"
            )
            L += [
                "",
                f"**`{c['label']}` − `{rep.baseline}`**: {what}; an interval and a verdict need at least "
                f"2 paired seeds. Verdict: **{c['verdict']}**.",
            ]
            continue
        L += [
            "",
            f"**`{c['label']}` − `{rep.baseline}`**: over n = {c['n']} seeds paired with the baseline ({seeds}), "
            f"the final validation loss differs by {_f(c['mean'], '+.4f')} nats/token on average (std {_f(c['std'])}); "
            f"{conf} {_ci(c['ci'])}, {tconf} {_ci(c['ci_tost'])}; TOST at ±{m:g} nats: one-sided "
            f"p = {_f(c['p_lower'], '.3g')} for H0 difference ≤ −{m:g} and p = {_f(c['p_upper'], '.3g')} for H0 "
            f"difference ≥ +{m:g}. Verdict: **{c['verdict']}**.",
        ]
    if rep.comparisons:
        L += [
            "",
            "## Step-time ratio (variant / baseline median step time, paired by seed)",
            "",
            f"Geometric mean of the per-seed ratios; the {conf} (Student t) is computed on the log-ratios and "
            "exponentiated.",
            "",
        ]
        L += _table(
            ["variant", "n", "geometric mean ratio", conf],
            [
                [
                    f"`{c['label']}`",
                    c["ratio"]["n"],
                    _f(c["ratio"]["gmean"], ".3f"),
                    _ci(c["ratio"]["ci"], ".3f"),
                ]
                for c in rep.comparisons
            ],
        )
    exc = [r for r in rep.runs if r.excluded is not None]
    L += ["", "## Excluded runs", ""]
    L += (
        _table(
            ["run dir", "variant", "seed", "reason"],
            [[f"`{r.path.name}`", f"`{r.label}`", r.seed, r.excluded] for r in exc],
        )
        if exc
        else ["None: every run completed with a finite final validation loss."]
    )
    L += [
        "",
        "## Figures",
        "",
        "Curves and step times use included runs only. Training loss is smoothed per run by a "
        f"bias-corrected EMA (beta = {EMA_BETA:g}, per logged step), then averaged over seeds.",
        "",
    ]
    titles = {
        "val_loss": "Validation loss vs step",
        "train_loss": "Training loss (EMA) vs step",
        "step_time": "Step-time distribution",
    }
    L += [
        f"![{t}]({rep.figures[k].name})\n" if rep.figures.get(k) else f"- {t}: no data\n"
        for k, t in titles.items()
    ]
    L += render_swept(rep) + render_diagnostics(rep)
    return "\n".join(L).rstrip("\n") + "\n"


def log_report_to_wandb(rep: Report, run: Any = None) -> bool:
    """Log the tables and figures of ``rep`` to a wandb ``run``; False (nothing done) without wandb or run."""
    if run is None:
        return False
    try:
        import wandb
    except ImportError:
        return False
    cols = ["n", "mean", "std", "min", "max", "step_time_ms", "tokens_per_s"]
    variants = [[v["label"], *(v[k] for k in cols)] for v in rep.variants]
    comparisons = [
        [c["label"], c["n"], c["mean"], *c["ci"], c["p_lower"], c["p_upper"], c["verdict"]]
        for c in rep.comparisons
    ]
    data = {
        "report/variants": wandb.Table(columns=["variant", *cols], data=variants),
        "report/comparisons": wandb.Table(
            columns=[
                "variant",
                "n",
                "mean_diff",
                "ci_lo",
                "ci_hi",
                "p_lower",
                "p_upper",
                "verdict",
            ],
            data=comparisons,
        ),
    }
    data.update({f"report/{k}": wandb.Image(str(p)) for k, p in rep.figures.items() if p})
    run.log(data)
    return True
