"""Variants of a comparison: labels from the keys that differ and change numbers, the check that
nothing else differs, the baseline, and the confounds a kind-vs-kind verdict must name.

Pure functions of :class:`~normlab.report.runs.Run` objects; no files read here.
"""

from __future__ import annotations

import json
import math
from fnmatch import fnmatch
from typing import Any

import yaml

from normlab.config.schedule import norm_tag
from normlab.report.runs import ReportError, Run, override_key

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
    return _canon(yaml.safe_load(override.split("=", 1)[1]) if "=" in override else override)


def _label_overrides(run: Run, ignore: tuple[str, ...] = ()) -> dict[str, str]:
    keys = {override_key(o): o for o in run.overrides}
    return {k: o for k, o in keys.items() if k != "seed" and k not in ignore and not is_inert(k)}


#: Keys that say where the norms sit (``normlab.config.norm.WHERE_KEYS``, under ``norm.``).
WHERE_KEYS = ("norm.placement", "norm.qk", "norm.embedding", "norm.blocks", "norm.positions")


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


def differences(a: Run, b: Run) -> list[str]:
    """Config keys where ``a`` and ``b`` differ that no differing override explains, as
    ``"key (va vs vb)"``; ``seed`` and :data:`INERT_KEYS` are skipped."""
    swept = {override_key(o) for o in set(a.overrides) ^ set(b.overrides)}
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


def confounds(runs: list[Run], labels: list[str]) -> list[str]:
    """One warning per setting of :data:`CONFOUNDS` whose resolved value differs between the
    variants ``labels`` (``norm.impl`` as the run resolved it, see :meth:`Run.resolved`), and one
    when variants of different ``norm.kind`` use an implementation outside
    :data:`SAME_CODE_FOR_EVERY_KIND`."""
    by_label = {lab: [r for r in runs if r.label == lab] for lab in labels}
    out = []
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
