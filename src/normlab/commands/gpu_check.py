"""``scripts/gpu_check.sh [--dry-run] [--out DIR]``: the first run on a GPU in one go. Each step is
a subprocess of a real command, timed against its own limit, its output in ``logs/<step>.log``:
``contract`` (the norm contract tests on the device), ``bench``, ``peak``, ``train`` (12 x 768,
bf16, compile, graph breaks counted), ``step_torch`` and ``step_compiled``. A failed step is
recorded and the next one runs; exit 1 if any failed. Writes ``gpu_check.json`` and
``gpu_check.md`` under ``outputs/gpu_check/<time>/`` (or ``--out``). ``--dry-run``: the same steps
on a CPU at tiny sizes, whose limits only guard a hang. Run from the repository root.

Why: docs/gpu.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import torch

from normlab.training.peak import device_name


@dataclass(frozen=True)
class Sizes:
    """What one mode runs: device, shapes, model, steps, per-step time limits (s)."""

    device: str
    contract: str
    contract_workers: str  # pytest-xdist's -n: "auto" (at most 4, pyproject) or "0" (in-process)
    bench_shapes: str
    bench_rounds: str
    model: str
    steps: int
    batch_size: int
    compile: bool
    fused: str
    pairs: int
    warmup: int
    limits: dict[str, int] = field(default_factory=dict)


LIMITS_GPU = {"contract": 140, "bench": 70, "peak": 25, "train": 125, "step_torch": 45}
#: The dry run's limit per step: a guard against a hang, never a speed check (a loaded machine
#: is slow, not broken).
DRY_LIMIT_S = 1800
GPU = Sizes(
    device="cuda",
    contract="model_widths or nan_and_inf or preflight_passes",
    contract_workers="auto",
    bench_shapes="8192x768,8192x4096",
    bench_rounds="--repeats 20",
    model="gpt2_small",
    steps=200,
    batch_size=16,
    compile=True,
    fused="triton",
    pairs=5,
    warmup=3,
    limits=LIMITS_GPU | {"step_compiled": 45},
)
DRY = Sizes(
    device="cpu",
    contract="(model_widths or nan_and_inf) and not compiled",
    contract_workers="0",  # its cases take seconds: starting workers would take longer
    bench_shapes="64x128",
    bench_rounds="--repeats 3 --warmup 1",
    model="tiny",
    steps=8,
    batch_size=4,
    compile=False,  # inductor's CPU compile of the whole tiny model would dominate the dry run
    fused="cpp",
    pairs=2,
    warmup=1,
    limits=dict.fromkeys(LIMITS_GPU | {"step_compiled": 0}, DRY_LIMIT_S),
)
BUDGET_S = 450  # the whole check on the GPU: 7.5 minutes, leaving the kit's install its seconds
CONTRACT = Path("tests/norms/test_norm_contract.py")  # from the repository root
#: The file each step writes, under ``--out``.
WRITES = {"contract": "contract.jsonl", "train": "train/summary.json"}
CONFIGURED_PEAK = 312.0  # train's default, pinned: MFU is recomputed against the measured one


# ------------------------------------------------ each step's figures, and the markdown
def _contract(r: list[dict], _) -> dict:
    failed = [c["case"] for c in r if c["outcome"] == "failed"]
    passed = sum(c["outcome"] == "passed" for c in r)
    slowest = max(r, key=lambda c: c["seconds"], default=None)
    return {
        "cases": len(r),
        "passed": passed,
        "skipped": len(r) - passed - len(failed),
        "failed": failed,
        "errors": {c["case"]: c["error"] for c in r if c["outcome"] == "failed"},
        "slowest": slowest and {"case": slowest["case"], "seconds": slowest["seconds"]},
    }


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
    "contract": _contract,
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
        if s["name"] == "contract" and (
            s["figures"].get("failed") or not s["figures"].get("passed")
        ):
            s["status"] = "failed"  # a failed case, or no case that passed, fails the step
    return steps


def report_graph_breaks(report: dict) -> dict | None:
    """The train step's graph breaks (None when it was not compiled)."""
    return next((s.get("graph_breaks") for s in report["steps"] if s["name"] == "train"), None)


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
    if o := fig.get("contract"):
        lines += [
            "",
            f"**Norm contract on the device**: {o['passed']}/{o['cases']} cases passed, "
            f"{o['skipped']} skipped; failed: {', '.join(o['failed']) or 'none'}",
        ]
        lines += [f"- `{case}`: {err}" for case, err in o["errors"].items()]
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
        if (gb := report_graph_breaks(report)) is not None:
            lines.append(f"\nGraph breaks in the compiled run: {gb['count']}")
            lines += [f"- {w}" for w in gb["where"]]
    for name in ("step_torch", "step_compiled"):
        if st := fig.get(name):
            lines.append(
                f"\n**Step {name}** (median per optimizer step): A {st['a']} {st['a_ms']:.1f} ms, "
                f"B {st['b']} "
                f"{st['b_ms']:.1f} ms: B/A {st['b_over_a']:.3f} (IQR "
                f"{st['b_over_a_iqr'][0]:.3f}-{st['b_over_a_iqr'][1]:.3f})"
            )
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------- the steps


def plan(s: Sizes, out: Path) -> list[tuple[str, list[str]]]:
    """``(step name, argv)`` of every step, in order; each step writes ``out/<name>.json`` (the
    contract ``out/contract.jsonl``, the train step ``out/train/summary.json``: ``WRITES``)."""
    q = {n: shlex.quote(str(out / f"{n}.json")) for n in FIGURES}
    pytest = (
        f"-m pytest -q -p no:cacheprovider -n {s.contract_workers} -m device {CONTRACT} "
        f"-k {shlex.quote(s.contract)}"
    )
    dev = f"--device {s.device}"
    common = (
        f"model={s.model} precision=bf16 norm=rms logger=none data.batch_size={s.batch_size} "
        f"device={s.device}"
    )
    step = f"bench step {common} --b norm.impl={s.fused} --pairs {s.pairs} --warmup {s.warmup}"
    refresh = " --refresh" if s.device == "cuda" else ""
    commands = {
        "contract": pytest,
        "bench": f"bench {dev} --dtypes fp32,bf16 --shapes {s.bench_shapes} {s.bench_rounds} "
        f"--json {q['bench']}",
        "peak": f"bench peak {dev}{refresh} --json {q['peak']}",
        "train": f"train {common} compile={str(s.compile).lower()} peak_tflops={CONFIGURED_PEAK:g} "
        "progress=false "
        f"max_steps={s.steps} eval_interval={s.steps} ckpt_interval=0 "
        f"hydra.run.dir={shlex.quote(str(out / 'train'))}",
        "step_torch": f"{step} --a norm.impl=torch --json {q['step_torch']}",
        "step_compiled": f"{step} --a norm.impl=compiled --json {q['step_compiled']}",
    }

    def argv(c: str) -> list[str]:
        if c.startswith("-m pytest"):
            return [sys.executable, *shlex.split(c)]
        return [sys.executable, "-m", f"normlab.commands.{c.split()[0]}", *shlex.split(c)[1:]]

    return [(n, argv(c)) for n, c in commands.items()]


def step_env(name: str, sizes: Sizes, out: Path, dry: bool) -> dict[str, str]:
    """The environment of step ``name``: this one without ``TRITON_INTERPRET`` (the contract sets it
    itself on a CPU); the dry run on one thread; the contract's device and per-case file; the
    compiled training run logging its graph breaks."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if dry:  # one CPU thread: two threads on a loaded 2-core machine run 2-4x slower
        env["OMP_NUM_THREADS"] = "1"
    if name == "contract":
        env |= {"NORMLAB_TEST_DEVICE": sizes.device, "NORMLAB_CASES_JSONL": str(out / WRITES[name])}
    if name == "train" and sizes.compile:
        env["TORCH_LOGS"] = "graph_breaks"
    return env


def read_output(name: str, path: Path):
    """What step ``name`` wrote: JSON, or for the contract its JSON lines; None when absent."""
    if not path.is_file():
        return None
    if name == "contract":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(path.read_text())


#: One line per graph break in a ``TORCH_LOGS=graph_breaks`` log.
GRAPH_BREAK = re.compile(r"\[__graph_breaks\] Graph break in user code at (\S+)")


def graph_breaks(log: Path) -> dict:
    """``{"count", "where"}``: the graph breaks a ``TORCH_LOGS=graph_breaks`` run logged, and the
    distinct source locations."""
    found = GRAPH_BREAK.findall(log.read_text(errors="replace")) if log.is_file() else []
    return {"count": len(found), "where": sorted(set(found))}


def run_step(name: str, argv: list[str], out: Path, limit_s: float, env: dict[str, str]) -> dict:
    """Run one step as a subprocess (stdout and stderr to ``out/logs/<name>.log``) within
    ``limit_s`` seconds; ``status`` ok (exit 0 and its output written), failed or timeout; ``raw``
    what it wrote (``read_output``), kept also after a failure or a timeout."""
    log = out / "logs" / f"{name}.log"
    record = {"name": name, "command": shlex.join(argv), "log": str(log.relative_to(out))}
    written = out / WRITES.get(name, f"{name}.json")
    written.unlink(missing_ok=True)  # a previous check's output in the same --out is not this one's
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.Popen(
            argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=max(limit_s, 1))
        except subprocess.TimeoutExpired:  # the step and what it started (compile workers)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    record["seconds"] = round(time.perf_counter() - t0, 2)
    record["returncode"] = rc
    if rc is None:
        record |= {"status": "timeout", "error": f"stopped after its limit of {limit_s:.0f} s"}
    elif rc != 0:
        record |= {"status": "failed", "error": f"exit status {rc}; see {record['log']}"}
    elif not written.is_file():
        record |= {"status": "failed", "error": f"exit 0 but {written.name} was not written"}
    else:
        record["status"] = "ok"
    record["raw"] = read_output(name, written)
    if "TORCH_LOGS" in env:
        record["graph_breaks"] = graph_breaks(log)
    return record


def versions() -> dict:
    """python, torch, CUDA (torch's build), triton (None when absent)."""
    try:
        triton = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the check (see the module docstring); exit 0 when every step is ok, 1 otherwise,
    2 when there is no CUDA device without ``--dry-run``."""
    p = argparse.ArgumentParser(
        prog="scripts/gpu_check.sh",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dry-run", action="store_true", help="the same steps on CPU, tiny sizes")
    p.add_argument("--out", type=Path, help="output folder (default: outputs/gpu_check/<time>)")
    args = p.parse_args(argv)
    sizes = DRY if args.dry_run else GPU
    if not args.dry_run and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device here; allowed: a machine with one, or --dry-run on CPU",
            file=sys.stderr,
        )
        return 2
    started = time.strftime("%Y-%m-%d_%H-%M-%S")
    out = args.out or Path("outputs/gpu_check") / started
    (out / "logs").mkdir(parents=True, exist_ok=True)
    t0, steps = time.perf_counter(), []
    for name, argv_ in plan(sizes, out.resolve()):
        left = BUDGET_S - (time.perf_counter() - t0) if not args.dry_run else math.inf
        env = step_env(name, sizes, out.resolve(), args.dry_run)
        steps.append(run_step(name, argv_, out, min(sizes.limits[name], left), env))
        print(
            f"gpu_check: {name}: {steps[-1]['status']} in {steps[-1]['seconds']:.1f} s", flush=True
        )
    steps = summarize(steps)
    report = {
        "dry_run": args.dry_run,
        "device": sizes.device,
        "device_name": device_name(torch.device(sizes.device)),
        "sizes": dataclasses.asdict(sizes),
        "versions": versions(),
        "started": started,
        "seconds": round(time.perf_counter() - t0, 1),
        "ok": all(s["status"] == "ok" for s in steps),
        "steps": steps,
    }
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    (out / "gpu_check.md").write_text(render(report))
    print(
        f"gpu_check: wrote {out / 'gpu_check.md'} and gpu_check.json"
        f"{'' if report['ok'] else '; some steps failed'}"
    )
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
