"""``scripts/gpu_check.sh [--dry-run] [--out DIR]``: the first GPU run, sized to a short rental.
Steps in order of value (``STEPS``), each a subprocess of a real command, timed against its own
limit and skipped when the budget left is below its minimum: versions, contract, bench, peak,
train_fused, train_compiled, step. Each writes into a scratch folder as it goes; after every step
all of it is packed into ``--out`` as ``PACKED`` (no checkpoint). SIGTERM ends the running step
and still writes the report. Exit 0 when every step is ok, 1 otherwise, 2 without a CUDA device.
``--dry-run``: the same on a CPU at tiny sizes, failing also when ``--out`` breaks the rental's
limits (``rental_problems``).

Why: docs/gpu.md
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import torch

from normlab.commands import gpu_report
from normlab.commands.gpu_report import PACKED, STEPS, WRITES, pack, rental_problems
from normlab.training.peak import device_name


@dataclass(frozen=True)
class Sizes:
    """What one mode runs: device, selections, shapes, model, steps, limits and minimums (s)."""

    device: str
    contract: str  # pytest -k selection of the device-marked contract cases
    contract_workers: int  # pytest-xdist's -n, as on the device: the rehearsal sees double counts
    bench: str
    model: str
    steps: int
    batch_size: int
    compile: bool
    fused: str
    step_bench: str
    budget_s: float
    limits: dict[str, float] = field(default_factory=dict)


#: Seconds each step may take on the GPU, and the least budget left that is worth starting it.
LIMITS_GPU = {
    "versions": 30,
    "contract": 150,
    "bench": 100,
    "peak": 20,
    "train_fused": 100,
    "train_compiled": 100,
    "step": 60,
}
MIN_S = {
    "versions": 5,
    "contract": 30,
    "bench": 20,
    "peak": 8,
    "train_fused": 45,
    "train_compiled": 45,
    "step": 30,
}
#: The dry run's limit per step: a guard against a hang, never a speed check (a loaded machine
#: is slow, not broken).
DRY_LIMIT_S = 1800
GPU = Sizes(
    device="cuda",
    contract="",  # every device case; Triton first, compiled last (tests/norms/conftest.py)
    contract_workers=4,
    bench="--kinds layer,rms,dyt --impls torch,triton,compiled --dtypes bf16,fp32 "
    "--shapes 65536x768,8192x4096 --repeats 20",  # 65536 x 768 bf16: 100 MB, past the L2
    model="gpt2_small",
    steps=200,
    batch_size=16,
    compile=True,
    fused="triton",
    step_bench="--pairs 5 --warmup 3",
    budget_s=540,  # scripts/gpu_run.sh's deadline (NORMLAB_CHECK_DEADLINE) may leave less
    limits=LIMITS_GPU,
)
DRY = Sizes(
    device="cpu",
    contract="not compiled and (triton or model_widths)",  # every Triton branch, interpreted
    contract_workers=2,
    bench="--kinds layer,rms,dyt --impls torch,cpp,compiled --dtypes bf16,fp32 --shapes 64x128 "
    "--repeats 3 --warmup 1",
    model="tiny",
    steps=8,
    batch_size=4,
    compile=False,  # inductor's CPU compile of the whole tiny model would dominate the dry run
    fused="cpp",
    step_bench="--pairs 2 --warmup 1",
    budget_s=math.inf,
    limits=dict.fromkeys(LIMITS_GPU, DRY_LIMIT_S),
)
#: The contract's files, from the repository root: every implementation against the oracle, and
#: the Triton norms' launches and their custom ops under torch.compile.
CONTRACT = (
    "tests/norms/test_norm_contract.py",
    "tests/norms/test_triton_launch_args.py",
    "tests/norms/test_triton_compile.py",
)
CONFIGURED_PEAK = 312.0  # train's peak_tflops, pinned: MFU is recomputed against two others


class Stopped(Exception):
    """SIGTERM arrived (an outer time limit) while a step ran: end it, write what finished."""


class Terminate:
    """The SIGTERM handler: records the request, and raises ``Stopped`` only while a step is
    awaited, so a signal between steps (reading an output, packing) never cuts the report short."""

    def __init__(self) -> None:
        self.requested = False
        self.waiting = False

    def __call__(self, signum, _frame) -> None:
        self.requested = True
        if self.waiting:
            raise Stopped(f"signal {signum}")


def plan(s: Sizes, work: Path) -> list[tuple[str, list[str]]]:
    """``(step name, argv)`` of every step in ``STEPS`` order; each writes ``work/WRITES[name]``."""
    q = {n: shlex.quote(str(work / w)) for n, w in WRITES.items()}
    select = f" -k {shlex.quote(s.contract)}" if s.contract else ""
    common = (
        f"model={s.model} precision=bf16 norm=rms logger=none data.batch_size={s.batch_size} "
        f"device={s.device}"
    )
    train = (
        f"train {common} compile={str(s.compile).lower()} peak_tflops={CONFIGURED_PEAK:g} "
        f"progress=false max_steps={s.steps} eval_interval={s.steps} ckpt_interval=0"
    )
    refresh = " --refresh" if s.device == "cuda" else ""
    commands = {
        "versions": f"-c {shlex.quote(VERSIONS)} {q['versions']}",
        "contract": f"-m pytest -q -p no:cacheprovider -n {s.contract_workers} --dist load "
        f"-m device {' '.join(CONTRACT)}{select}",
        "bench": f"bench --device {s.device} {s.bench} --by-group --json {q['bench']}",
        "peak": f"bench peak --device {s.device}{refresh} --json {q['peak']}",
        "train_fused": f"{train} norm.impl={s.fused} "
        f"hydra.run.dir={shlex.quote(str(work / 'train_fused'))}",
        "train_compiled": f"{train} norm.impl=compiled "
        f"hydra.run.dir={shlex.quote(str(work / 'train_compiled'))}",
        "step": f"bench step {common} --a norm.impl=compiled --b norm.impl={s.fused} "
        f"{s.step_bench} --json {q['step']}",
    }

    def argv(c: str) -> list[str]:
        if c.startswith("-"):
            return [sys.executable, *shlex.split(c)]
        return [sys.executable, "-m", f"normlab.commands.{c.split()[0]}", *shlex.split(c)[1:]]

    return [(n, argv(commands[n])) for n in STEPS]


def write_versions(path: str) -> None:
    """The versions step: python, torch, CUDA, Triton, Hydra, the device, where normlab is imported
    from, the code (``NORMLAB_COMMIT``, ``NORMLAB_KIT_SOURCES``: the kit's sources digest) and the
    kit's install seconds, printed and written as JSON to ``path``."""
    import hydra  # the kit's: its import is part of the check

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        triton = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton = None
    found = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton,
        "hydra": hydra.__version__,
        "device_name": device_name(dev),
        "gpus": torch.cuda.device_count(),
        "capability": list(torch.cuda.get_device_capability()) if dev.type == "cuda" else None,
        "normlab": str(Path(__file__).parents[1]),
        "kit_install_s": os.environ.get("NORMLAB_KIT_INSTALL_S"),
        "commit": os.environ.get("NORMLAB_COMMIT") or None,
        "kit_sources": os.environ.get("NORMLAB_KIT_SOURCES") or None,
    }
    print(json.dumps(found))
    Path(path).write_text(json.dumps(found))


VERSIONS = "import sys; from normlab.commands.gpu_check import write_versions as w; w(sys.argv[1])"


def step_env(name: str, sizes: Sizes, work: Path, dry: bool) -> dict[str, str]:
    """The environment of step ``name``: this one without ``TRITON_INTERPRET`` (the contract sets it
    itself on a CPU); the dry run on one thread; the contract's device and per-case file; a
    compiled training run logging its graph breaks."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if dry:  # one CPU thread: two threads on a loaded 2-core machine run 2-4x slower
        env["OMP_NUM_THREADS"] = "1"
    if name == "contract":
        env |= {
            "NORMLAB_TEST_DEVICE": sizes.device,
            "NORMLAB_CASES_JSONL": str(work / WRITES[name]),
        }
    if name.startswith("train") and sizes.compile:
        env["TORCH_LOGS"] = "graph_breaks"
    return env


def read_output(name: str, path: Path):
    """What step ``name`` wrote: JSON, or for the contract its JSON lines (a torn last line, cut
    by the limit, left out); None when absent or unreadable."""
    try:
        text = path.read_text()
        if name != "contract":
            return json.loads(text)
    except (OSError, ValueError):
        return None
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


#: One line per graph break in a ``TORCH_LOGS=graph_breaks`` log.
GRAPH_BREAK = re.compile(r"\[__graph_breaks\] Graph break in user code at (\S+)")
#: A line that states an error: ``ValueError: ...``, ``normlab-bench: ...``, ``x: error: ...``.
ERROR_LINE = re.compile(r"^(\w[\w.]*(Error|Exception|Interrupt)\b|[\w-]+: (error: )?\S)")


def graph_breaks(log: Path) -> dict:
    """``{"count", "where"}``: the graph breaks a ``TORCH_LOGS=graph_breaks`` run logged, and the
    distinct source locations."""
    found = GRAPH_BREAK.findall(log.read_text(errors="replace")) if log.is_file() else []
    return {"count": len(found), "where": sorted(set(found))}


def own_error(log: Path) -> str:
    """The failed command's own message: the last line of its log that states an error (else its
    last line), at most 300 characters; "" for an empty log."""
    lines = [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()]
    found = next((x for x in reversed(lines) if ERROR_LINE.match(x)), lines[-1] if lines else "")
    return found[:300]


def _wait(proc: subprocess.Popen, limit_s: float, term: Terminate) -> tuple[int | None, str | None]:
    """``(returncode, why stopped)``: the step's exit status, or None and the reason after its
    limit or a SIGTERM (the step's whole process group is killed: compile workers too)."""
    try:
        term.waiting = True
        if term.requested:
            raise Stopped("before the step")
        return proc.wait(timeout=max(limit_s, 1)), None
    except subprocess.TimeoutExpired:
        why = f"stopped after its limit of {limit_s:.0f} s"
    except Stopped:
        why = "stopped by SIGTERM (an outer time limit)"
    finally:
        term.waiting = False
    with contextlib.suppress(ProcessLookupError):  # it may have ended as the signal came
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return None, why


def run_step(
    name: str,
    argv: list[str],
    work: Path,
    limit_s: float,
    env: dict[str, str],
    term: Terminate | None = None,
) -> dict:
    """Run one step (stdout and stderr to ``work/logs/<name>.log``) within ``limit_s`` seconds;
    ``status`` ok (exit 0, its output written), failed, timeout or stopped (SIGTERM); ``raw``
    what it wrote (``read_output``), kept also after a failure or a stop."""
    log = work / "logs" / f"{name}.log"
    record = {"name": name, "command": shlex.join(argv), "log": f"logs/{name}.log"}
    written = work / WRITES[name]
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.Popen(
            argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        rc, why = _wait(proc, limit_s, term or Terminate())
    record |= {"seconds": round(time.perf_counter() - t0, 2), "returncode": rc}
    if why is not None:
        record |= {"status": "stopped" if "SIGTERM" in why else "timeout", "error": why}
    elif rc != 0:
        record |= {"status": "failed", "error": f"exit status {rc}: {own_error(log)}"}
    elif not written.is_file():
        record |= {"status": "failed", "error": f"exit 0 but {WRITES[name]} was not written"}
    else:
        record["status"] = "ok"
    record["raw"] = read_output(name, written)
    if "TORCH_LOGS" in env:
        record["graph_breaks"] = graph_breaks(log)
    return record


def not_run(name: str, why: str) -> dict:
    """The record of a step that did not start."""
    return {"name": name, "status": "skipped", "error": why, "seconds": 0.0, "command": ""}


def run_all(
    sizes: Sizes, work: Path, out: Path, report: dict, dry: bool, term: Terminate | None = None
) -> None:
    """Every step in order into ``report["steps"]``, packing ``out`` after each; a step whose
    minimum exceeds the budget left (``sizes.budget_s``) is skipped; after a SIGTERM
    (``term.requested``) the rest are not run."""
    t0, term = time.perf_counter(), term or Terminate()
    for name, argv in plan(sizes, work):
        left = sizes.budget_s - (time.perf_counter() - t0)
        if term.requested:
            rec = not_run(name, "not run: SIGTERM ended the check")
        elif left < MIN_S[name]:
            rec = not_run(
                name, f"{left:.0f} s of budget left, under its minimum of {MIN_S[name]} s"
            )
        else:
            env = step_env(name, sizes, work, dry)
            rec = run_step(name, argv, work, min(sizes.limits[name], left), env, term)
        report["steps"].append(rec)
        print(f"gpu_check: {name}: {rec['status']} in {rec['seconds']:.1f} s", flush=True)
        report["seconds"] = round(time.perf_counter() - t0, 1)
        pack(out, work, report)


def budget(sizes: Sizes) -> float:
    """The seconds the steps may take: ``sizes.budget_s``, or less when ``NORMLAB_CHECK_DEADLINE``
    (a Unix time, set by ``scripts/gpu_run.sh``) comes sooner; ValueError for a bad deadline."""
    deadline = os.environ.get("NORMLAB_CHECK_DEADLINE")
    if not deadline:
        return sizes.budget_s
    try:
        left = float(deadline) - time.time()
    except ValueError:
        raise ValueError(f"NORMLAB_CHECK_DEADLINE={deadline!r} is not a Unix time") from None
    return min(sizes.budget_s, left)


def main(argv: list[str] | None = None) -> int:
    """Run the check (module docstring); exit 0 when every step is ok and ``--out`` is within the
    rental's limits, 1 otherwise, 2 when there is no CUDA device without ``--dry-run``."""
    p = argparse.ArgumentParser(
        prog="scripts/gpu_check.sh",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dry-run", action="store_true", help="the same steps on CPU, tiny sizes")
    p.add_argument("--out", type=Path, help="output folder (default: outputs/gpu_check/<time>)")
    args = p.parse_args(argv)
    sizes = DRY if args.dry_run else GPU
    try:
        sizes = dataclasses.replace(sizes, budget_s=budget(sizes))
    except ValueError as e:
        print(f"gpu_check: {e}; allowed: seconds since 1970, or unset", file=sys.stderr)
        return 2
    if not args.dry_run and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device here; allowed: a machine with one, or --dry-run on CPU",
            file=sys.stderr,
        )
        return 2
    started = time.strftime("%Y-%m-%d_%H-%M-%S")
    out = (args.out or Path("outputs/gpu_check") / started).absolute()
    if held := [n for n in PACKED if os.path.lexists(out / n)]:  # never overwrite a report
        print(
            f"gpu_check: --out {out} already holds {held[0]} of an earlier check; allowed: a new "
            "or empty folder",
            file=sys.stderr,
        )
        return 2
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="normlab_gpu_check_"))  # checkpoints stay here
    (work / "logs").mkdir()
    report = {
        "dry_run": args.dry_run,
        "device": sizes.device,
        "sizes": dataclasses.asdict(sizes) | {"budget_s": f"{sizes.budget_s:.0f}"},
        "started": started,
        "seconds": 0.0,
        "steps": [],
    }
    term = Terminate()
    previous = signal.signal(signal.SIGTERM, term)
    try:
        run_all(sizes, work, out, report, args.dry_run, term)
    finally:
        done = pack(out, work, report)
        if problems := rental_problems(out, report) if args.dry_run else []:
            report["rental"] = problems
            done = pack(out, work, report)
        shutil.rmtree(work, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)
    for line in problems:
        print(f"gpu_check: {line}", file=sys.stderr)
    ok = gpu_report.steps_ok(done["steps"]) and not problems
    print(f"gpu_check: wrote {', '.join(str(out / n) for n in PACKED)}")
    print(f"gpu_check: {'all steps ok' if ok else 'SOME STEPS FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
