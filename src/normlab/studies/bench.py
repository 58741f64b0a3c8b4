"""``normlab-bench``: is a norm slow, or is its implementation? Two benchmarks in one script.

``normlab-bench [--kinds layer,rms] [--impls torch,reference,compiled,cpp] [--dtypes fp32,bf16]
[--shapes 8192x768] [--model small] [--cache warm|cold]`` times every norm kind x implementation x
dtype x shape: forward (under ``no_grad``) and forward+backward (``autograd.grad`` of x, weight,
bias: nothing accumulates), after warm-up calls that also absorb ``torch.compile``. Timing runs in
interleaved rounds (every case once per round, plus a same-size ``dst.copy_(src)`` timed the same
way) so a slow moment of a shared machine hits every case alike. Reported: the median over
``--repeats`` rounds; the samples are in the JSON. Each sample is taken in one of two cache
regimes (``--cache``):

- ``warm`` (default): before each sample, untimed calls of the same case until it is back in its
  steady state after the other cases' memory traffic: at least ``--settle`` calls (default 4; a
  working set several times the L2 needs 3-4 passes to be L3/L2-hot again), and more, up to twice
  that, while the last one is still over 1.1x the case's fastest single call so far. Then ``inner``
  calls are timed together, ``inner`` chosen so that a sample lasts >= 2 ms. The regime of a
  training step, where the norm's input was just written by the previous op.
- ``cold``: before each sample, one untimed call of the case (the allocator in its steady state),
  then a read and write of a ``--flush-mb`` MiB buffer on the bench device (default 512: several
  times a typical CPU L3 or GPU L2; raise it for a larger cache) that evicts the caches, a
  synchronize, and exactly one timed call (``inner`` = 1): every call starts from DRAM / HBM.

On CPU the bench first asks glibc to keep freed memory in the process (:func:`keep_freed_memory`),
so that no sample pays for page faults that glibc's trimming heuristics cause (JSON ``malloc``).

Bytes model (each tensor counted in its own dtype; per-row statistics ignored): forward reads x,
weight (+bias) and writes y; forward+backward adds reading x and dy and writing dx, dweight
(+dbias). A copy moves 2x the bytes of x. GB/s = bytes / time / 1e9; ``copy_frac`` is that over the
copy's GB/s on the same device, the practical ceiling of a memory-bound kernel.

``normlab-bench step --a norm=layer --b norm=fused model=small data.batch_size=8`` builds both
training setups from the real Hydra configs in one process and times whole optimizer steps
(forward, backward, clip, AdamW; batches drawn before the clock starts) in interleaved pairs (A B,
then B A, alternating) after warm-up steps: median step time of each, median and spread of B/A.
"""

from __future__ import annotations

import dataclasses
import math
import platform
import time
from collections.abc import Callable

import numpy as np
import torch
import yaml

from normlab.compose import compose, find_conf_dir
from normlab.config import ConfigError, NormConfig, NormImpl, NormKind
from normlab.data.tokens import BatchSampler, prepare
from normlab.model import GPT
from normlab.norms import build_norm, resolve_norm
from normlab.training.loop import lr_at, make_optimizer, resolve_device, seed_everything
from normlab.training.precision import autocast, check_precision, grad_scaler
from normlab.training.tracking import synchronize

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _csv(text: str) -> list[str]:
    return [v for v in text.split(",") if v]


def _count(n: int, noun: str) -> str:
    """``"1 thread"``, ``"2 threads"``: ``n`` and ``noun``, plural unless ``n`` is 1."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _recompile_limit():
    """Every shape / dtype / grad mode is a graph of its own: never fall back to eager silently."""
    return torch._dynamo.config.patch(recompile_limit=max(64, torch._dynamo.config.recompile_limit))


def keep_freed_memory() -> str:
    """Ask glibc to keep freed memory in the process (``mallopt``: no ``mmap`` for large blocks, no
    trimming of the heap top). PyTorch's CPU allocator is plain ``malloc``; with glibc's defaults a
    freed 25 MB tensor can go back to the kernel and the next call page-faults it in again, which
    made samples bimodal (about 10 vs 20 ms for the same norm case) depending on glibc's heuristics,
    not on the kernel timed. Returns what was done, recorded in the JSON (``malloc``)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_max = -1, -4
        if libc.mallopt(m_mmap_max, 0) == 1 and libc.mallopt(m_trim_threshold, 2**31 - 1) == 1:
            return "glibc mallopt: freed memory kept in the process (no mmap, no trim)"
    except (OSError, AttributeError):
        pass
    return "allocator defaults (not glibc)"


def parse_shape(text: str) -> tuple[int, int]:
    """``"8192x768"`` -> ``(8192, 768)``: rows x hidden size."""
    rows, d = (int(v) for v in text.lower().split("x"))
    return rows, d


def model_width(name: str) -> int:
    """``d_model`` of ``conf/model/<name>.yaml``."""
    return int(yaml.safe_load((find_conf_dir() / "model" / f"{name}.yaml").read_text())["d_model"])


SETTLE_TOL = 1.1  # an untimed call within 10% of the case's fastest single call: steady state


def sample_ms(fn: Callable[[], object], device: torch.device, inner: int = 1) -> float:
    """Wall ms per call of ``fn``: ``inner`` calls between two synchronized clock reads."""
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    synchronize(device)
    return (time.perf_counter() - t0) * 1e3 / inner


def settle(
    fn: Callable[[], object], device: torch.device, calls: int, ref_ms: float = math.inf
) -> tuple[int, float]:
    """Untimed calls of ``fn`` before a warm sample: at least ``calls``, then more, up to
    ``2 * calls``, while the last one took over ``SETTLE_TOL`` x the fastest single call seen
    (``ref_ms`` or these). Returns ``(calls made, fastest of them in ms)``."""
    n, best, last = 0, math.inf, math.inf
    while n < calls or (n < 2 * calls and last > SETTLE_TOL * min(ref_ms, best)):
        last = sample_ms(fn, device)
        best, n = min(best, last), n + 1
    return n, best


def make_flush(device: torch.device, mb: int) -> Callable[[], object]:
    """A cache flush: each call reads and writes every byte of one ``mb`` MiB buffer on ``device``."""
    buf = torch.zeros(mb * 2**20, dtype=torch.uint8, device=device)
    return lambda: buf.add_(1)


def cold_sample_ms(
    fn: Callable[[], object], device: torch.device, flush: Callable[[], object]
) -> float:
    """Wall ms of one call of ``fn`` with cold caches: one untimed call (so its allocations reuse
    memory instead of page-faulting fresh pages), ``flush()``, then the timed call; ``sample_ms``
    synchronizes before reading the clock, so the flush is not timed."""
    fn()
    flush()
    return sample_ms(fn, device, 1)


def norm_bytes(
    shape: tuple[int, int], dtype: torch.dtype, param_dtype: torch.dtype, bias: bool
) -> tuple[int, int]:
    """``(forward bytes, forward+backward bytes)`` under the bytes model of the module docstring."""
    n = shape[0] * shape[1] * dtype.itemsize
    p = shape[1] * param_dtype.itemsize * (2 if bias else 1)
    fwd = 2 * n + p  # read x, read weight (+bias), write y
    return fwd, fwd + 3 * n + p  # + read x, read dy, write dx, write dweight (+dbias)


@dataclasses.dataclass
class _Case:
    name: dict
    calls: dict[str, Callable[[], object]]
    bytes: dict[str, int]
    inner: dict[str, int] = dataclasses.field(default_factory=dict)
    ms: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    untimed: dict[str, list[int]] = dataclasses.field(
        default_factory=dict
    )  # untimed calls before each sample
    fastest: dict[str, float] = dataclasses.field(
        default_factory=dict
    )  # fastest single call seen (ms)


def _norm_case(kind: NormKind, impl: NormImpl, dtype: str, x, dy, device, param_dtype) -> _Case:
    cfg = resolve_norm(NormConfig(kind=kind, impl=impl), device.type)
    norm = build_norm(cfg, x.shape[1]).to(device=device, dtype=param_dtype or x.dtype)
    with torch.no_grad():  # non-trivial parameters, the same for every implementation
        g = torch.Generator().manual_seed(0)
        for p in norm.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if p is norm.weight else 0.0))
    inputs = (x, *norm.parameters())

    def fwd():
        with torch.no_grad():
            return norm(x)

    def fwdbwd():
        return torch.autograd.grad(norm(x), inputs, dy)

    fwd_bytes, fb_bytes = norm_bytes(
        tuple(x.shape), x.dtype, norm.weight.dtype, norm.bias is not None
    )
    name = {
        "kind": kind.name,
        "impl": impl.name,
        "dtype": dtype,
        "shape": list(x.shape),
        "param_dtype": str(norm.weight.dtype).removeprefix("torch."),
    }
    return _Case(name, {"fwd": fwd, "fwdbwd": fwdbwd}, {"fwd": fwd_bytes, "fwdbwd": fb_bytes})


CACHE_REGIMES = ("warm", "cold")


def bench_norms(
    kinds: list[str],
    impls: list[str],
    dtypes: list[str],
    shapes: list[tuple[int, int]],
    *,
    repeats: int = 20,
    warmup: int = 3,
    device: str = "auto",
    param_dtype: str | None = None,
    min_sample_ms: float = 2.0,
    cache: str = "warm",
    settle_calls: int = 4,
    flush_mb: int = 512,
    flush: Callable[[], object] | None = None,
) -> dict:
    """Time every norm case and the copy baseline; returns the JSON-ready result.

    ``rows``: per (kind, impl, dtype, shape) ``fwd_ms`` / ``fwdbwd_ms`` (median ms per call),
    ``*_min_ms``, ``*_samples_ms``, ``*_untimed_calls`` (per sample), ``*_bytes``, ``*_gbps`` (GB/s)
    and ``*_copy_frac`` (of the copy's GB/s). ``copy``: per (dtype, shape) ``ms``, ``bytes``,
    ``gbps``. ``summary``: :func:`summarize`. ``skipped``: cases the device cannot run, with the
    reason. ``param_dtype`` None: weight and bias in the input dtype.

    ``cache`` (module docstring): ``"warm"``: >= ``settle_calls`` untimed calls of the case before
    each sample of ``inner`` calls, ``inner`` chosen so that one sample takes >= ``min_sample_ms``;
    ``"cold"``: ``flush()`` before each sample of one call; ``flush`` None: :func:`make_flush` of
    ``flush_mb`` MiB on the bench device.
    """
    if cache not in CACHE_REGIMES:
        raise ValueError(f"cache={cache!r}: expected one of {', '.join(CACHE_REGIMES)}")
    if settle_calls < 0 or flush_mb <= 0:
        raise ValueError(
            f"settle_calls={settle_calls}, flush_mb={flush_mb}: expected settle_calls >= 0 and flush_mb > 0"
        )
    warm = cache == "warm"
    dev = resolve_device(device)
    cases, copies, skipped = [], {}, []
    for dtype in dtypes:
        for shape in shapes:
            g = torch.Generator().manual_seed(1)
            x = torch.randn(shape, generator=g).to(device=dev, dtype=DTYPES[dtype]).requires_grad_()
            dy = torch.randn(shape, generator=g).to(device=dev, dtype=DTYPES[dtype])
            src, dst = x.detach().clone(), torch.empty_like(x)
            copies[(dtype, shape)] = c = _Case(
                {"dtype": dtype, "shape": list(shape)},
                {"copy": lambda s=src, d=dst: d.copy_(s)},
                {"copy": 2 * x.numel() * x.element_size()},
            )
            cases.append(c)
            for kind in kinds:
                for impl in impls:
                    try:
                        cases.append(
                            _norm_case(
                                NormKind[kind],
                                NormImpl[impl],
                                dtype,
                                x,
                                dy,
                                dev,
                                DTYPES.get(param_dtype),
                            )
                        )
                    except (ConfigError, RuntimeError, ImportError) as e:
                        skipped.append(
                            {
                                "kind": kind,
                                "impl": impl,
                                "dtype": dtype,
                                "shape": list(shape),
                                "reason": str(e).splitlines()[0],
                            }
                        )
    if not warm and flush is None:
        flush = make_flush(dev, flush_mb)
    with _recompile_limit():
        for case in list(cases):  # warm-up (compilation), then the calls per sample
            try:
                for (
                    key,
                    fn,
                ) in (
                    case.calls.items()
                ):  # warm: + settle_calls, so the fastest is a steady-state call
                    case.fastest[key] = est = min(
                        sample_ms(fn, dev)
                        for _ in range(max(1, warmup) + (settle_calls if warm else 0))
                    )
                    case.inner[key] = (
                        max(1, math.ceil(min_sample_ms / max(est, 1e-6))) if warm else 1
                    )
                    case.ms[key], case.untimed[key] = [], []
            except (
                Exception
            ) as e:  # a kernel that cannot run this dtype / shape: reported, not fatal
                cases.remove(case)
                skipped.append(
                    {
                        **case.name,
                        "reason": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}",
                    }
                )
        for _ in range(repeats):  # interleaved rounds
            for case in cases:
                for key, fn in case.calls.items():
                    if warm:
                        n, best = settle(fn, dev, settle_calls, case.fastest[key])
                        case.fastest[key] = min(case.fastest[key], best)
                        case.ms[key].append(sample_ms(fn, dev, case.inner[key]))
                    else:
                        n = 1
                        case.ms[key].append(cold_sample_ms(fn, dev, flush))
                    case.untimed[key].append(n)
    copy_rows, rows = [], []
    for case in cases:
        med = {k: float(np.median(v)) for k, v in case.ms.items()}
        if "copy" in case.calls:
            copy_rows.append(
                {
                    **case.name,
                    "ms": med["copy"],
                    "bytes": case.bytes["copy"],
                    "gbps": case.bytes["copy"] / med["copy"] / 1e6,
                    "inner": case.inner["copy"],
                    "samples_ms": case.ms["copy"],
                    "untimed_calls": case.untimed["copy"],
                }
            )
            continue
        copy = copies[(case.name["dtype"], tuple(case.name["shape"]))]
        row = {
            **case.name,
            "inner": case.inner,
            "copy_gbps": copy.bytes["copy"] / float(np.median(copy.ms["copy"])) / 1e6,
        }
        for key in ("fwd", "fwdbwd"):
            gbps = case.bytes[key] / med[key] / 1e6  # bytes / ms / 1e6 = GB/s
            row.update(
                {
                    f"{key}_ms": med[key],
                    f"{key}_min_ms": min(case.ms[key]),
                    f"{key}_bytes": case.bytes[key],
                    f"{key}_gbps": gbps,
                    f"{key}_copy_frac": gbps / row["copy_gbps"],
                    f"{key}_samples_ms": case.ms[key],
                    f"{key}_untimed_calls": case.untimed[key],
                }
            )
        rows.append(row)
    bytes_model = " ".join(__doc__.split("Bytes model ")[1].split("\n\n")[0].split())
    return {
        "mode": "norm",
        "device": str(dev),
        "host": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "warmup": warmup,
        "cache": cache,
        "settle_calls": settle_calls if warm else None,
        "flush_mb": None if warm else flush_mb,
        "min_sample_ms": min_sample_ms if warm else None,
        "bytes_model": bytes_model,
        "copy": copy_rows,
        "rows": rows,
        "summary": summarize(rows),
        "skipped": skipped,
    }


def summarize(rows: list[dict]) -> list[dict]:
    """Per (dtype, shape): the fastest RMSNorm vs the fastest LayerNorm, forward+backward (ms).

    ``rms_faster_pct`` = (layer_ms / rms_ms - 1) * 100 (throughput gain); ``time_saved_pct`` =
    (1 - rms_ms / layer_ms) * 100.
    """
    out = []
    for dtype, shape in dict.fromkeys((r["dtype"], tuple(r["shape"])) for r in rows):
        best = {}
        for kind in ("rms", "layer"):
            group = [
                r
                for r in rows
                if r["kind"] == kind and r["dtype"] == dtype and tuple(r["shape"]) == shape
            ]
            if group:
                best[kind] = min(group, key=lambda r: r["fwdbwd_ms"])
        if len(best) == 2:
            rms, layer = best["rms"]["fwdbwd_ms"], best["layer"]["fwdbwd_ms"]
            out.append(
                {
                    "dtype": dtype,
                    "shape": list(shape),
                    "rms_impl": best["rms"]["impl"],
                    "rms_ms": rms,
                    "layer_impl": best["layer"]["impl"],
                    "layer_ms": layer,
                    "rms_faster_pct": (layer / rms - 1) * 100,
                    "time_saved_pct": (1 - rms / layer) * 100,
                }
            )
    return out


def summary_line(s: dict) -> str:
    """One entry of :func:`summarize` in words: "is N% faster than ... (M% less time)" when RMSNorm
    takes no more time than LayerNorm, else "is M% slower than ..." (M = rms_ms / layer_ms - 1)."""
    rms = f"RMSNorm fastest ({s['rms_impl']}, {s['rms_ms']:.3f} ms)"
    layer = f"LayerNorm fastest ({s['layer_impl']}, {s['layer_ms']:.3f} ms) fwd+bwd"
    head = f"{s['dtype']} {'x'.join(map(str, s['shape']))}: {rms}"
    if s["rms_ms"] <= s["layer_ms"]:
        return f"{head} is {s['rms_faster_pct']:.0f}% faster than {layer} ({s['time_saved_pct']:.0f}% less time)"
    return f"{head} is {-s['time_saved_pct']:.0f}% slower than {layer}"


def format_norm_table(result: dict) -> str:
    """The norm benchmark as plain-text aligned columns, then one summary line per dtype and shape."""
    head = [
        "kind",
        "impl",
        "dtype",
        "shape",
        "fwd ms",
        "fwd GB/s",
        "fwd %copy",
        "f+b ms",
        "f+b GB/s",
        "f+b %copy",
    ]
    body = [
        [
            r["kind"],
            r["impl"],
            r["dtype"],
            "x".join(map(str, r["shape"])),
            f"{r['fwd_ms']:.3f}",
            f"{r['fwd_gbps']:.1f}",
            f"{100 * r['fwd_copy_frac']:.0f}%",
            f"{r['fwdbwd_ms']:.3f}",
            f"{r['fwdbwd_gbps']:.1f}",
            f"{100 * r['fwdbwd_copy_frac']:.0f}%",
        ]
        for r in result["rows"]
    ]
    body += [
        [
            "copy",
            "dst.copy_",
            c["dtype"],
            "x".join(map(str, c["shape"])),
            f"{c['ms']:.3f}",
            f"{c['gbps']:.1f}",
            "100%",
            "",
            "",
            "",
        ]
        for c in result["copy"]
    ]
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    if result["cache"] == "warm":
        regime = f"cache warm (>= {_count(result['settle_calls'], 'untimed call')} of the case before each sample)"
    else:
        regime = f"cache cold ({result['flush_mb']} MiB flush before each one-call sample)"
    lines = [
        f"normlab-bench on {result['device']} ({result['host']}, {_count(result['threads'], 'thread')}, torch {result['torch']}), median of {_count(result['repeats'], 'interleaved round')}, {regime}"
    ]
    lines += [
        "  ".join(
            c.rjust(w) if i > 3 else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [head, *body]
    ]
    lines += [summary_line(s) for s in result["summary"]]
    lines += [
        f"skipped {s.get('kind', 'copy')}/{s.get('impl', '-')} {s['dtype']} {s['shape']}: {s['reason']}"
        for s in result["skipped"]
    ]
    return "\n".join(lines)


# --- whole training steps -----------------------------------------------------------------------


@dataclasses.dataclass
class StepSetup:
    """One training setup built as ``train`` builds it: resolved config, model, AdamW, scaler, batches."""

    overrides: list[str]
    cfg: object  # TrainConfig with the norm resolved and vocab_size filled in
    device: torch.device
    model: torch.nn.Module
    fwd: Callable  # the model, or torch.compile(model) with compile=true
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    sampler: object  # data.BatchSampler
    step: int = 0

    def run_step(self) -> float:
        """One optimizer step (micro-batches fwd+bwd, unscale, clip, AdamW, zero_grad); wall ms."""
        cfg = self.cfg
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.step, cfg.max_steps, cfg.optim)
        batches = [self.sampler.train_batch(self.step, m) for m in range(cfg.optim.grad_accum)]
        synchronize(self.device)
        t0 = time.perf_counter()
        for x, y in batches:
            with autocast(cfg.precision.dtype, self.device):
                _, loss = self.fwd(x, y)
            self.scaler.scale(loss / cfg.optim.grad_accum).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(
            self.model.parameters(),
            cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf"),
        )
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        synchronize(self.device)
        self.step += 1
        return (time.perf_counter() - t0) * 1e3


def build_setup(overrides: list[str]) -> StepSetup:
    """Compose ``conf/train.yaml`` with ``overrides``; build its model, optimizer and batches.

    Raises:
        ConfigError, DataError: as ``train`` would, before anything is timed.
    """
    cfg = compose(list(overrides))
    device = resolve_device(cfg.device)
    data = prepare(cfg.data)
    model_cfg = dataclasses.replace(cfg.model, vocab_size=cfg.model.vocab_size or data.vocab_size)
    cfg = dataclasses.replace(cfg, norm=resolve_norm(cfg.norm, device.type), model=model_cfg)
    check_precision(cfg.precision.dtype, device)
    seed_everything(cfg.seed)
    model = GPT(cfg.model, cfg.norm).to(device)
    fwd = torch.compile(model) if cfg.compile else model
    sampler = BatchSampler(data, cfg.data.batch_size, cfg.model.context_length, cfg.seed, device)
    return StepSetup(
        list(overrides),
        cfg,
        device,
        model,
        fwd,
        make_optimizer(model, cfg.optim, device),
        grad_scaler(cfg.precision, device),
        sampler,
    )


def bench_step(
    a: list[str], b: list[str], common: list[str] = (), *, pairs: int = 10, warmup: int = 3
) -> dict:
    """Interleaved optimizer-step timing of the setups ``common + a`` and ``common + b``.

    Returns JSON-ready data: per setup ``median_ms`` and ``times_ms`` (ms per optimizer step), its
    resolved norm and tokens per step; ``ratio``: B/A step time per pair (``per_pair``) with its
    ``median``, ``p25`` / ``p75`` (IQR) and ``p10`` / ``p90``.
    """
    setups = [build_setup([*common, *a]), build_setup([*common, *b])]
    times: list[list[float]] = [[], []]
    with _recompile_limit():
        for _ in range(warmup):
            for s in setups:
                s.run_step()
        for i in range(pairs):
            for j in (0, 1) if i % 2 == 0 else (1, 0):
                times[j].append(setups[j].run_step())
    ratios = np.array(times[1]) / np.array(times[0])
    p10, p25, med, p75, p90 = (float(v) for v in np.percentile(ratios, [10, 25, 50, 75, 90]))

    def info(s: StepSetup, own: list[str], t: list[float]) -> dict:
        return {
            "overrides": list(own),
            "composed_with": s.overrides,
            "norm": f"{s.cfg.norm.kind.name}/{s.cfg.norm.impl.name}",
            "precision": s.cfg.precision.dtype.name,
            "model": s.cfg.model.name,
            "tokens_per_step": s.cfg.tokens_per_step,
            "median_ms": float(np.median(t)),
            "times_ms": t,
        }

    return {
        "mode": "step",
        "device": str(setups[0].device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "pairs": pairs,
        "warmup": warmup,
        "common": list(common),
        "a": info(setups[0], a, times[0]),
        "b": info(setups[1], b, times[1]),
        "ratio": {
            "median": med,
            "p10": p10,
            "p25": p25,
            "p75": p75,
            "p90": p90,
            "per_pair": ratios.tolist(),
        },
    }


def format_step(result: dict) -> str:
    """The step benchmark in four lines."""
    r = result["ratio"]
    lines = [
        f"step benchmark on {result['device']} ({_count(result['threads'], 'thread')}): {_count(result['pairs'], 'interleaved pair')} after {_count(result['warmup'], 'warm-up step')} each; both: {' '.join(result['common']) or '-'}"
    ]
    for key in ("a", "b"):
        s = result[key]
        lines.append(
            f"{key.upper()} {' '.join(s['overrides']) or '(defaults)'} [{s['model']}, {s['norm']}, {s['precision']}, {s['tokens_per_step']} tokens/step]: median {s['median_ms']:.1f} ms/step"
        )
    lines.append(
        f"B/A step time: median {r['median']:.3f} (IQR {r['p25']:.3f}-{r['p75']:.3f}, 10-90% {r['p10']:.3f}-{r['p90']:.3f})"
    )
    return "\n".join(lines)
