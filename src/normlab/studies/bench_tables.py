"""The norm benchmark's verdict and text table: RMSNorm's fastest against LayerNorm's fastest per
dtype and shape, and the aligned columns ``normlab-bench`` prints."""

from __future__ import annotations

from normlab.studies.bench_step import count


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
        return (
            f"{head} is {s['rms_faster_pct']:.0f}% faster than {layer} "
            f"({s['time_saved_pct']:.0f}% less time)"
        )
    return f"{head} is {-s['time_saved_pct']:.0f}% slower than {layer}"


def format_norm_table(result: dict) -> str:
    """The norm benchmark as plain-text aligned columns, then one summary line per dtype and
    shape."""
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
