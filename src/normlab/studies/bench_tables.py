"""The norm benchmark's verdict and text table: RMSNorm's (and DyT's) fastest against LayerNorm's
fastest per dtype and shape, and the aligned columns ``normlab-bench`` prints."""

from __future__ import annotations

from normlab.studies.bench_step import count

#: The kinds each compared with LayerNorm, and their names in words (the norm table's other kinds).
CHALLENGERS = {"rms": "RMSNorm", "dyt": "DyT"}


def summarize(rows: list[dict]) -> list[dict]:
    """Per (dtype, shape) and per kind of :data:`CHALLENGERS` present: its fastest implementation vs
    the fastest LayerNorm, forward+backward (ms).

    For kind K (``kind``): ``K_impl``, ``K_ms``, ``K_faster_pct`` = (layer_ms / K_ms - 1) * 100
    (throughput gain); ``time_saved_pct`` = (1 - K_ms / layer_ms) * 100.
    """
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
    """One entry of :func:`summarize` in words: "is N% faster than ... (M% less time)" when the
    kind takes no more time than LayerNorm, else "is M% slower than ..." (M = K_ms / layer_ms -
    1)."""
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
