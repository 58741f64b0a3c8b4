"""``scripts/gpu_check.sh [--dry-run] [--out DIR]``: the first run on a GPU, in one go, in at most
8 minutes on one H100/H200; every step is a subprocess of a real command, timed, its output kept in
``logs/<step>.log``; a failed step is recorded and the next one runs; exit 1 if any failed.

1. ``oracle``: every norm implementation on the device (Triton compiled, ``TRITON_INTERPRET``
   unset) against the float64 oracle, forward and backward (``commands/gpu_oracle.py``).
2. ``bench``: ``normlab-bench`` of every implementation in fp32 and bf16, each case's fraction of
   the measured copy bandwidth.
3. ``peak``: ``normlab-bench peak``, the measured dense matmul peak (fp32, bf16; ``training.peak``).
4. ``train``: ``train`` 12 x 768 (``model=gpt2_small``), bf16, compile, ``norm=rms``, 200 steps of
   16 x 1024 tokens on Shakespeare bytes (offline); tokens/s, and MFU recomputed against step 3's
   bf16 peak: ``mfu_measured = mfu * peak_tflops / measured`` (``summary.json`` reports MFU
   against the configured ``peak_tflops``).
5. ``step_torch``, ``step_compiled``: ``normlab-bench step`` of the fused kernel (B) against
   ``norm.impl=torch`` and ``norm.impl=compiled`` (A) in the same model.

Writes ``gpu_check.json`` and ``gpu_check.md`` under ``outputs/gpu_check/<time>/`` (or ``--out``).
``--dry-run`` runs the same steps on CPU at tiny sizes (``model=tiny``, small shapes, Triton under
``TRITON_INTERPRET=1``, the C++ kernel as the fused one, whole-model compile off: inductor's CPU
compile of even the tiny model takes about 20 s) in under a minute.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import torch

from normlab.commands.gpu_check_report import FIGURES, render, summarize
from normlab.training.peak import device_name


@dataclass(frozen=True)
class Sizes:
    """What one mode runs: device, shapes, model, steps, per-step time limits (s)."""

    device: str
    oracle_shapes: str
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


LIMITS_GPU = {"oracle": 75, "bench": 100, "peak": 30, "train": 140, "step_torch": 60}
GPU = Sizes(
    device="cuda",
    oracle_shapes="8192x768,4096x4097",
    bench_shapes="8192x768,8192x4096",
    bench_rounds="--repeats 20",
    model="gpt2_small",
    steps=200,
    batch_size=16,
    compile=True,
    fused="triton",
    pairs=5,
    warmup=3,
    limits=LIMITS_GPU | {"step_compiled": 60},
)
DRY = Sizes(
    device="cpu",
    oracle_shapes="16x128,33x129",
    bench_shapes="64x128",
    bench_rounds="--repeats 3 --warmup 1",
    model="tiny",
    steps=8,
    batch_size=4,
    compile=False,  # inductor's CPU compile of the whole tiny model: about 20 s
    fused="cpp",
    pairs=2,
    warmup=1,
    limits=dict.fromkeys(LIMITS_GPU | {"step_compiled": 0}, 90),
)
BUDGET_S = 480  # the whole check: 8 minutes
CONFIGURED_PEAK = 312.0  # train's default, pinned: MFU is recomputed against the measured one


def plan(s: Sizes, out: Path) -> list[tuple[str, list[str]]]:
    """``(step name, argv)`` of every step, in order; each step writes ``out/<name>.json`` (the
    train step ``out/train/summary.json``)."""
    q = {n: shlex.quote(str(out / f"{n}.json")) for n in FIGURES}
    dev = f"--device {s.device}"
    common = (
        f"model={s.model} precision=bf16 norm=rms logger=none data.batch_size={s.batch_size} "
        f"device={s.device}"
    )
    step = f"bench step {common} --b norm.impl={s.fused} --pairs {s.pairs} --warmup {s.warmup}"
    refresh = " --refresh" if s.device == "cuda" else ""
    commands = {
        "oracle": f"gpu_oracle {dev} --shapes {s.oracle_shapes} --json {q['oracle']}",
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
    py = [sys.executable, "-m"]
    return [
        (n, [*py, f"normlab.commands.{c.split()[0]}", *shlex.split(c)[1:]])
        for n, c in commands.items()
    ]


def run_step(name: str, argv: list[str], out: Path, limit_s: float, dry: bool) -> dict:
    """Run one step as a subprocess (stdout and stderr to ``out/logs/<name>.log``) within
    ``limit_s`` seconds; ``status`` ok (exit 0 and its JSON written), failed or timeout."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if dry:  # one CPU thread: two threads on a loaded 2-core machine run 2-4x slower
        env["OMP_NUM_THREADS"] = "1"
    if dry and name == "oracle":
        env["TRITON_INTERPRET"] = "1"  # Triton on CPU: read when the kernels are imported
    log = out / "logs" / f"{name}.log"
    record = {"name": name, "command": shlex.join(argv), "log": str(log.relative_to(out))}
    written = out / ("train/summary.json" if name == "train" else f"{name}.json")
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
    record["raw"] = json.loads(written.read_text()) if written.is_file() else None
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
        left = BUDGET_S - (time.perf_counter() - t0)
        steps.append(run_step(name, argv_, out, min(sizes.limits[name], left), args.dry_run))
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
