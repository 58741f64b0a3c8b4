"""``normlab-bench``: is a norm slow, or is its implementation? Two benchmarks in one script.

``normlab-bench [--kinds layer,rms,dyt] [--impls torch,reference,compiled,cpp] [--dtypes fp32,bf16]
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

On CPU the bench first asks glibc to keep freed memory in the process
(``training.host_memory.keep_freed_memory``), so that no sample pays for page faults that glibc's
trimming heuristics cause (JSON ``malloc``).

Bytes model (each tensor counted in its own dtype; per-row statistics ignored): forward reads x,
weight (+bias) and writes y; forward+backward adds reading x and dy and writing dx, dweight
(+dbias). A copy moves 2x the bytes of x. GB/s = bytes / time / 1e9; ``copy_frac`` is that over the
copy's GB/s on the same device, the practical ceiling of a memory-bound kernel.

Whole training steps: ``bench_step.py``.
"""

from __future__ import annotations

import dataclasses
import math
import platform
from collections.abc import Callable

import numpy as np
import torch
import yaml

from normlab.compose import find_conf_dir
from normlab.config import ConfigError, NormConfig, NormImpl, NormKind
from normlab.norms import build_norm, resolve_norm
from normlab.studies.bench_step import recompile_limit
from normlab.studies.bench_tables import summarize
from normlab.studies.timing import cold_sample_ms, make_flush, sample_ms, settle
from normlab.training.distributed import resolve_device


class BenchError(RuntimeError):
    """The bench measured nothing: every case was skipped."""


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def csv(text: str) -> list[str]:
    """``"a,b,"`` -> ``["a", "b"]``."""
    return [v for v in text.split(",") if v]


def parse_shape(text: str) -> tuple[int, int]:
    """``"8192x768"`` -> ``(8192, 768)``: rows x hidden size."""
    rows, d = (int(v) for v in text.lower().split("x"))
    return rows, d


def model_width(name: str) -> int:
    """``d_model`` of ``conf/model/<name>.yaml``."""
    return int(yaml.safe_load((find_conf_dir() / "model" / f"{name}.yaml").read_text())["d_model"])


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
        g = torch.Generator().manual_seed(0)  # drawn on the CPU, moved to the bench device
        for p in norm.parameters():
            p.add_((torch.randn(p.shape, generator=g) * 0.5).to(p.device))  # around its init
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


def _refuse_empty(cases: list[_Case], skipped: list[dict], dev: torch.device) -> None:
    """Raise :class:`BenchError` when no norm case is left to report (copies alone are not a
    bench), naming the first reasons the cases were skipped."""
    if any("copy" not in c.calls for c in cases):
        return
    reasons = "; ".join(
        f"{s.get('kind')}/{s.get('impl')}/{s.get('dtype')}: {s['reason']}" for s in skipped[:3]
    )
    more = "; ..." if len(skipped) > 3 else ""
    raise BenchError(
        f"no norm case ran on {dev}: all {len(skipped)} were skipped ({reasons}{more})"
    )


def _skip(name: dict, e: BaseException, with_type: bool = False) -> dict:
    text = (str(e).splitlines() or [""])[0]
    return {**name, "reason": f"{type(e).__name__}: {text}" if with_type else text}


def _cases(kinds, impls, dtypes, shapes, dev, param_dtype) -> tuple[list[_Case], dict, list]:
    """Every norm case and one copy case per (dtype, shape); the cases the device cannot build."""
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
                    name = {"kind": kind, "impl": impl, "dtype": dtype, "shape": list(shape)}
                    try:
                        k, i = NormKind[kind], NormImpl[impl]
                        cases.append(_norm_case(k, i, dtype, x, dy, dev, DTYPES.get(param_dtype)))
                    except (ConfigError, RuntimeError, ImportError) as e:
                        skipped.append(_skip(name, e))
    return cases, copies, skipped


def _warm_up(cases, dev, warmup, settle_calls, min_sample_ms, warm, skipped) -> None:
    """Warm-up calls (compilation); warm: + ``settle_calls``, so the fastest is a steady-state
    call, and ``inner`` from it. A case that cannot run is moved to ``skipped``, not fatal."""
    for case in list(cases):
        try:
            for key, fn in case.calls.items():
                n = max(1, warmup) + (settle_calls if warm else 0)
                case.fastest[key] = est = min(sample_ms(fn, dev) for _ in range(n))
                case.inner[key] = max(1, math.ceil(min_sample_ms / max(est, 1e-6))) if warm else 1
                case.ms[key], case.untimed[key] = [], []
        except Exception as e:  # a kernel that cannot run this dtype / shape: reported
            cases.remove(case)
            skipped.append(_skip(case.name, e, with_type=True))


def _rounds(cases, dev, repeats, warm, settle_calls, flush) -> None:
    """``repeats`` interleaved rounds: every case once per round, in its cache regime."""
    for _ in range(repeats):
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


def _copy_row(case: _Case) -> dict:
    ms = float(np.median(case.ms["copy"]))
    return {
        **case.name,
        "ms": ms,
        "bytes": case.bytes["copy"],
        "gbps": case.bytes["copy"] / ms / 1e6,
        "inner": case.inner["copy"],
        "samples_ms": case.ms["copy"],
        "untimed_calls": case.untimed["copy"],
    }


def _norm_row(case: _Case, copy: _Case) -> dict:
    row = {
        **case.name,
        "inner": case.inner,
        "copy_gbps": copy.bytes["copy"] / float(np.median(copy.ms["copy"])) / 1e6,
    }
    for key in ("fwd", "fwdbwd"):
        med = float(np.median(case.ms[key]))
        gbps = case.bytes[key] / med / 1e6  # bytes / ms / 1e6 = GB/s
        row.update(
            {
                f"{key}_ms": med,
                f"{key}_min_ms": min(case.ms[key]),
                f"{key}_bytes": case.bytes[key],
                f"{key}_gbps": gbps,
                f"{key}_copy_frac": gbps / row["copy_gbps"],
                f"{key}_samples_ms": case.ms[key],
                f"{key}_untimed_calls": case.untimed[key],
            }
        )
    return row


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

    Raises:
        ValueError: ``cache`` not one of :data:`CACHE_REGIMES`, ``settle_calls`` < 0 or
            ``flush_mb`` <= 0.
        BenchError: every norm case was skipped (an empty bench measures nothing); the message
            gives the first reasons.
    """
    if cache not in CACHE_REGIMES:
        raise ValueError(f"cache={cache!r}: expected one of {', '.join(CACHE_REGIMES)}")
    if settle_calls < 0 or flush_mb <= 0:
        raise ValueError(
            f"settle_calls={settle_calls}, flush_mb={flush_mb}: "
            "expected settle_calls >= 0 and flush_mb > 0"
        )
    warm = cache == "warm"
    dev = resolve_device(device)
    cases, copies, skipped = _cases(kinds, impls, dtypes, shapes, dev, param_dtype)
    if not warm and flush is None:
        flush = make_flush(dev, flush_mb)
    with recompile_limit():
        _warm_up(cases, dev, warmup, settle_calls, min_sample_ms, warm, skipped)
        _rounds(cases, dev, repeats, warm, settle_calls, flush)
    _refuse_empty(cases, skipped, dev)
    copy_rows = [_copy_row(c) for c in cases if "copy" in c.calls]
    rows = [
        _norm_row(c, copies[(c.name["dtype"], tuple(c.name["shape"]))])
        for c in cases
        if "copy" not in c.calls
    ]
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
