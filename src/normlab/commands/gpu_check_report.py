"""The aggregation behind ``scripts/gpu_check.sh`` (``commands/gpu_check.py``): each step's figures
from the JSON its command wrote, and the markdown of the whole check."""

from __future__ import annotations


def _oracle(r: dict, _) -> dict:
    worst: dict[str, float] = {}
    for c in r["cases"]:
        if "max_error" in c:
            worst[c["dtype"]] = max(worst.get(c["dtype"], 0.0), c["max_error"])
    failed = [
        f"{c['kind']}/{c['impl']}/{c['dtype']}/{'x'.join(map(str, c['shape']))}"
        for c in r["cases"]
        if not c["ok"]
    ]
    return {"cases": len(r["cases"]), "passed": r["passed"], "failed": failed, "worst_error": worst}


def _bench(r: dict, _) -> dict:
    keys = ("fwd_ms", "fwdbwd_ms", "fwd_copy_frac", "fwdbwd_copy_frac")
    rows = [
        {
            "case": f"{x['kind']} {x['impl']} {x['dtype']} {'x'.join(map(str, x['shape']))}",
            **{k: x[k] for k in keys},
        }
        for x in r["rows"]
    ]
    copy = {f"{c['dtype']} {'x'.join(map(str, c['shape']))}": c["gbps"] for c in r["copy"]}
    return {"rows": rows, "copy_gbps": copy}


def _peak(r: dict, _) -> dict:
    return {"fp32_tflops": r["fp32"]["tflops"], "bf16_tflops": r["bf16"]["tflops"]}


def _train(r: dict, raws: dict) -> dict:
    configured = r["config"]["peak_tflops"]
    if not isinstance(configured, int | float):
        raise ValueError(f"summary.json config.peak_tflops={configured!r} is not a number")
    peak = raws.get("peak") and raws["peak"][r["precision"]]["tflops"]
    return {
        "status": r["status"],
        "steps": r["steps_completed"],
        "norm_impl": r["norm_impl"],
        "precision": r["precision"],
        "compile": r["config"]["compile"],
        "tokens_per_s": r["tokens_per_s"],
        "step_time_ms_median": r["step_time_ms_median"],
        "final_val_loss": r["final_val_loss"],
        "peak_tflops_configured": configured,
        "mfu_configured": r["mfu"],
        "mfu_measured": r["mfu"] * configured / peak if peak else None,
    }


def _step(r: dict, _) -> dict:
    return {
        "a": r["a"]["norm"],
        "b": r["b"]["norm"],
        "a_ms": r["a"]["median_ms"],
        "b_ms": r["b"]["median_ms"],
        "b_over_a": r["ratio"]["median"],
        "b_over_a_iqr": [r["ratio"]["p25"], r["ratio"]["p75"]],
    }


FIGURES = {
    "oracle": _oracle,
    "bench": _bench,
    "peak": _peak,
    "train": _train,
    "step_torch": _step,
    "step_compiled": _step,
}


def summarize(steps: list[dict]) -> list[dict]:
    """Each step's ``figures`` from its raw JSON (``raw``, dropped); a raw JSON that lacks a key
    fails the step with the reason. The train step's MFU uses the peak step's raw JSON."""
    raws = {s["name"]: s.get("raw") for s in steps}
    for s in steps:
        raw = s.pop("raw", None)
        try:
            s["figures"] = FIGURES[s["name"]](raw, raws) if raw is not None else {}
        except (KeyError, TypeError, ValueError) as e:
            s |= {"status": "failed", "error": f"unexpected output: {type(e).__name__}: {e}"}
            s["figures"] = {}
        if s["name"] == "oracle" and s["figures"].get("failed"):
            s["status"] = "failed"
    return steps


def _num(v, spec: str = ".3g") -> str:
    return "-" if v is None else format(v, spec)


def render(report: dict) -> str:
    """The markdown of ``gpu_check.json``'s content: header, step table, figures per step."""
    v, fig = report["versions"], {s["name"]: s["figures"] for s in report["steps"]}
    lines = [
        f"# normlab GPU check{' (dry run on CPU)' if report['dry_run'] else ''}",
        "",
        f"Device: {report['device_name']} ({report['device']}); "
        + ", ".join(f"{k} {val}" for k, val in v.items()),
        "",
        f"Started {report['started']}, {report['seconds']:.0f} s in all; "
        f"{'all steps ok' if report['ok'] else 'SOME STEPS FAILED'}.",
        "",
        *(
            [
                "Dry run: this CPU at tiny sizes, whole-model compile off; CPU figures.",
                "",
            ]
            if report["dry_run"]
            else []
        ),
        "| step | status | seconds | command |",
        "|---|---|---|---|",
    ]
    for s in report["steps"]:
        status = s["status"] + (f" ({s['error']})" if s.get("error") else "")
        lines.append(f"| {s['name']} | {status} | {s['seconds']:.1f} | `{s['command']}` |")
    if o := fig.get("oracle"):
        worst = ", ".join(f"{k} {val:.2e}" for k, val in o["worst_error"].items())
        lines += [
            "",
            f"**Oracle**: {o['passed']}/{o['cases']} cases ok; worst normwise error "
            f"{worst}; failed: {', '.join(o['failed']) or 'none'}",
        ]
    if b := fig.get("bench"):
        lines += [
            "",
            "**Norm kernels** (median ms; fraction of the copy's GB/s)",
            "",
            "| case | fwd ms | fwd %copy | f+b ms | f+b %copy |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['case']} | {r['fwd_ms']:.4f} | {r['fwd_copy_frac']:.0%} | "
            f"{r['fwdbwd_ms']:.4f} | {r['fwdbwd_copy_frac']:.0%} |"
            for r in b["rows"]
        ]
        lines.append("\nCopy GB/s: " + ", ".join(f"{k} {g:.1f}" for k, g in b["copy_gbps"].items()))
    if p := fig.get("peak"):
        lines += [
            "",
            f"**Matmul peak** (measured): fp32 {p['fp32_tflops']:.2f} TFLOP/s, "
            f"bf16 {p['bf16_tflops']:.2f} TFLOP/s",
        ]
    if t := fig.get("train"):
        lines += [
            "",
            f"**Training** ({t['steps']} steps, {t['precision']}, compile "
            f"{t['compile']}, norm {t['norm_impl']}): {_num(t['tokens_per_s'], ',.0f')} "
            f"tokens/s, median step {_num(t['step_time_ms_median'], '.1f')} ms, MFU "
            f"{_num(t['mfu_measured'], '.1%')} of the measured peak ("
            f"{_num(t['mfu_configured'], '.2%')} of the configured "
            f"{t['peak_tflops_configured']:g} TFLOP/s); final val loss "
            f"{_num(t['final_val_loss'], '.4f')}",
        ]
    for name in ("step_torch", "step_compiled"):
        if st := fig.get(name):
            lines.append(
                f"\n**Step {name}** (median per optimizer step): A {st['a']} {st['a_ms']:.1f} ms, "
                f"B {st['b']} "
                f"{st['b_ms']:.1f} ms: B/A {st['b_over_a']:.3f} (IQR "
                f"{st['b_over_a_iqr'][0]:.3f}-{st['b_over_a_iqr'][1]:.3f})"
            )
    return "\n".join(lines) + "\n"
