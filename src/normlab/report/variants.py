"""The variants of a set of runs: labels from the overrides that change a number, a refusal for an
unexplained difference, the baseline, and the confounds a verdict must state.

Why: docs/reports.md
"""

from __future__ import annotations

import json
import math
from fnmatch import fnmatch
from typing import Any

import yaml

from normlab.config import norm_table
from normlab.config.files import RunFileError, yaml_text
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
    """True when ``key`` (dotted) is one of ``INERT_KEYS`` or lies below one."""
    return any(fnmatch(key, p) or fnmatch(key, p + ".*") for p in INERT_KEYS)


def canon(v: Any) -> str:
    """``v`` as canonical JSON text: equal values give equal text."""
    return json.dumps(v, sort_keys=True, default=str)


def _effect(run: Run, key: str, override: str | None) -> str:
    """What the override of ``key`` did: its config under ``key``, else its YAML value."""
    sub = {k: v for k, v in run.config.items() if k == key or k.startswith(key + ".")}
    if sub:
        return canon(sub)
    if override is None:
        return "<unset>"
    return override_value(override) if "=" in override else canon(override)


def override_value(override: str) -> str:
    """The canonical value of ``key=value`` as YAML reads it (no alias), else its text."""
    value = override.split("=", 1)[1]
    try:
        return canon(yaml_text(value))
    except (RunFileError, yaml.YAMLError):
        return canon(value)


def _label_overrides(run: Run, ignore: tuple[str, ...] = ()) -> dict[str, str]:
    keys = {override_key(o): o for o in run.overrides}
    return {k: o for k, o in keys.items() if k != "seed" and k not in ignore and not is_inert(k)}


#: Keys that say where the norms sit (the norm table's ``WHERE_KEYS``, under ``norm.``).
WHERE_KEYS = tuple(f"norm.{k}" for k in norm_table.WHERE_KEYS)


def design_tag(run: Run) -> str:
    """The run's norm design (``norm_tag``): ``rms-peri-qkhead``, ``layer[0-1:rms]-pre``, ..."""
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
    """Set each run's ``label`` (differing overrides, design tag or ``kind/impl``); returns the
    overrides no label holds, sorted."""
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
    """Keys where ``a``, ``b`` differ that no differing override explains: ``"key (va vs vb)"``."""
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
    """Raises ReportError (the keys and two run dirs) for runs that differ in an unexplained key."""
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
    """``requested``, else ``layer-pre``, else the one LayerNorm, else the first label. Raises
    ReportError: ``requested`` is no variant's label."""
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
    """The warning that the confound checks leave out ``labels``."""
    each = ", ".join(f"`{lab}`" for lab in labels)
    settings = ", ".join(CONFOUNDS.values())
    return (
        f"the checks that the variants agree in {settings} leave out {each}: no included run "
        "(see Excluded runs), so no value to compare"
    )


def confounds(runs: list[Run], labels: list[str]) -> list[str]:
    """A warning per differing ``CONFOUNDS`` setting, kind-vs-kind impl, variant left out."""
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
