"""``normlab-bench``: is a norm slow, or is its implementation? Forward and forward+backward of
every kind x implementation x dtype x shape in interleaved rounds with a same-size ``copy_``, in
a warm (``settle``) or cold (``cold_sample_ms``) cache; ``summarize`` gives the verdict.

Bytes model (each tensor counted in its own dtype; per-row statistics ignored): forward reads x,
weight (+bias) and writes y; forward+backward adds reading x and dy and writing dx, dweight
(+dbias). A copy moves 2x the bytes of x. GB/s = bytes / time / 1e9; ``copy_frac`` is that over the
copy's GB/s on the same device, the practical ceiling of a memory-bound kernel.

Why: docs/benchmarks.md
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

from normlab.bench.step import count, recompile_limit
from normlab.compose import find_conf_dir
from normlab.config import ConfigError, NormConfig, NormImpl, NormKind
from normlab.norms import build_norm, resolve_norm
from normlab.training.distributed import resolve_device
from normlab.training.tracking import synchronize


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
    # the module docstring's "Bytes model" paragraph is read into the JSON: keep it there
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
    """Raise ``BenchError`` naming the first skip reasons when no norm case is left (copies alone
    are not a bench)."""
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
    """Warm-up calls (compilation; warm: + ``settle_calls``) and ``inner`` from the fastest; a case
    that cannot run moves to ``skipped``."""
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
    """Time every norm case and the copy baseline: the JSON-ready result, ``rows`` with median ms,
    GB/s and ``copy_frac`` per case. Raises ValueError for a bad ``cache``, ``settle_calls`` < 0 or
    ``flush_mb`` <= 0, BenchError when every norm case was skipped."""
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
    """Untimed calls of ``fn`` before a warm sample: ``calls``, up to twice that while the last is
    over ``SETTLE_TOL`` x the fastest seen. Returns ``(calls made, fastest ms)``."""
    n, best, last = 0, math.inf, math.inf
    while n < calls or (n < 2 * calls and last > SETTLE_TOL * min(ref_ms, best)):
        last = sample_ms(fn, device)
        best, n = min(best, last), n + 1
    return n, best


def make_flush(device: torch.device, mb: int) -> Callable[[], object]:
    """A cache flush: each call reads and writes every byte of ``mb`` MiB on ``device``."""
    buf = torch.zeros(mb * 2**20, dtype=torch.uint8, device=device)
    return lambda: buf.add_(1)


def cold_sample_ms(
    fn: Callable[[], object], device: torch.device, flush: Callable[[], object]
) -> float:
    """Wall ms of one call of ``fn`` with cold caches: untimed call, ``flush()``, timed call."""
    fn()  # its allocations reuse memory instead of page-faulting fresh pages
    flush()  # not timed: sample_ms synchronizes before reading the clock
    return sample_ms(fn, device, 1)


#: The kinds each compared with LayerNorm, and their names in words (the norm table's other kinds).
CHALLENGERS = {"rms": "RMSNorm", "dyt": "DyT"}


def summarize(rows: list[dict]) -> list[dict]:
    """Per (dtype, shape) and kind K of ``CHALLENGERS``: its fastest forward+backward vs the fastest
    LayerNorm's, ``K_faster_pct`` = (layer_ms / K_ms - 1) * 100, ``time_saved_pct`` = (1 - K_ms /
    layer_ms) * 100."""
    out = []
    for dtype, shape in dict.fromkeys((r["dtype"], tuple(r["shape"])) for r in rows):
        best = {}
        for kind in ("layer", *CHALLENGERS):
            group = [
                r
                for r in rows
                if r["kind"] == kind and r["dtype"] == dtype and tuple(r["shape"]) == shape
            ]
            if group:
                best[kind] = min(group, key=lambda r: r["fwdbwd_ms"])
        for kind in CHALLENGERS:
            if kind not in best or "layer" not in best:
                continue
            ms, layer = best[kind]["fwdbwd_ms"], best["layer"]["fwdbwd_ms"]
            out.append(
                {
                    "dtype": dtype,
                    "shape": list(shape),
                    "kind": kind,
                    f"{kind}_impl": best[kind]["impl"],
                    f"{kind}_ms": ms,
                    "layer_impl": best["layer"]["impl"],
                    "layer_ms": layer,
                    f"{kind}_faster_pct": (layer / ms - 1) * 100,
                    "time_saved_pct": (1 - ms / layer) * 100,
                }
            )
    return out


def summary_line(s: dict) -> str:
    """One entry of ``summarize`` in words: "is N% faster than ... (M% less time)", or "is M%
    slower than ..."."""
    kind = s.get("kind", "rms")
    ms = s[f"{kind}_ms"]
    challenger = f"{CHALLENGERS[kind]} fastest ({s[f'{kind}_impl']}, {ms:.3f} ms)"
    layer = f"LayerNorm fastest ({s['layer_impl']}, {s['layer_ms']:.3f} ms) fwd+bwd"
    head = f"{s['dtype']} {'x'.join(map(str, s['shape']))}: {challenger}"
    if ms <= s["layer_ms"]:
        return (
            f"{head} is {s[f'{kind}_faster_pct']:.0f}% faster than {layer} "
            f"({s['time_saved_pct']:.0f}% less time)"
        )
    return f"{head} is {-s['time_saved_pct']:.0f}% slower than {layer}"


def format_norm_table(result: dict) -> str:
    """The norm benchmark as aligned text columns, then a summary line per dtype and shape."""
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
        regime = (
            f"cache warm (>= {count(result['settle_calls'], 'untimed call')} of the case before "
            "each sample)"
        )
    else:
        regime = f"cache cold ({result['flush_mb']} MiB flush before each one-call sample)"
    lines = [
        f"normlab-bench on {result['device']} ({result['host']}, "
        f"{count(result['threads'], 'thread')}, torch {result['torch']}), median of "
        f"{count(result['repeats'], 'interleaved round')}, {regime}"
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
        f"skipped {s.get('kind', 'copy')}/{s.get('impl', '-')} {s['dtype']} {s['shape']}: "
        f"{s['reason']}"
        for s in result["skipped"]
    ]
    return "\n".join(lines)
