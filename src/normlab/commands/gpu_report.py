"""The GPU check's report: each step's figures from what it wrote, the markdown, and the packing of
a scratch folder into at most three files (``PACKED``) that a short rental hands back, with
``rental_problems`` naming what would not come back (``commands/gpu_check.py`` runs the steps).

Why: docs/gpu.md
"""

from __future__ import annotations

import copy
import io
import json
import os
import tarfile
from collections import Counter
from pathlib import Path

from normlab.training.peak import datasheet_bf16_tflops

#: The steps, in order of value.
STEPS = ("versions", "contract", "bench", "peak", "train_fused", "train_compiled", "step")
#: The file each step writes, under the scratch folder.
WRITES = {
    "versions": "versions.json",
    "contract": "contract.jsonl",
    "bench": "bench.json",
    "peak": "peak.json",
    "train_fused": "train_fused/summary.json",
    "train_compiled": "train_compiled/summary.json",
    "step": "step.json",
}
#: What ``--out`` receives: the report, its JSON, and every log and step output in one archive.
PACKED = ("gpu_check.md", "gpu_check.json", "logs.tar.gz")
#: The rental's limits on what comes back from ``--out``.
MAX_FILES, MAX_DEPTH, MAX_FILE_BYTES = 8, 2, 5 * 2**20
#: What the archive leaves out of a run dir (a checkpoint is about 1.5 GB at 12 x 768), and the
#: largest file it takes (a log keeps its last bytes).
LEFT_OUT = {"checkpoints", "wandb"}
MAX_MEMBER_BYTES = 1 * 2**20


def impl_of(case: str) -> str:
    """compiled, triton or other: the implementation a contract case's parameter id names."""
    params = case.partition("[")[2].rstrip("]").split("-")
    return "compiled" if "compiled" in params else "triton" if "triton" in params else "other"


def _contract(r: list[dict], _) -> dict:
    seen = Counter(c["case"] for c in r)
    failed = [c["case"] for c in r if c["outcome"] == "failed"]
    passed = sum(c["outcome"] == "passed" for c in r)
    slowest = max(r, key=lambda c: c["seconds"], default=None)
    by_impl = Counter(impl_of(c["case"]) for c in r if c["outcome"] == "passed")
    return {
        "cases": len(seen),
        "passed": passed,
        "skipped": len(r) - passed - len(failed),
        "failed": failed,
        "passed_by_impl": dict(by_impl),
        "twice": sorted(c for c, n in seen.items() if n > 1),
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
    copy_gbps = {f"{c['dtype']} {'x'.join(map(str, c['shape']))}": c["gbps"] for c in r["copy"]}
    return {"rows": rows, "copy_gbps": copy_gbps, "complete": r.get("complete", True)}


def _peak(r: dict, _) -> dict:
    return {"fp32_tflops": r["fp32"]["tflops"], "bf16_tflops": r["bf16"]["tflops"]}


def _ratio(a, b):
    return None if a is None or not b else a / b


def _train(r: dict, raws: dict) -> dict:
    configured = r["config"]["peak_tflops"]
    if not isinstance(configured, int | float):
        raise ValueError(f"summary.json config.peak_tflops={configured!r} is not a number")
    achieved = None if r.get("mfu") is None else r["mfu"] * configured
    measured = raws.get("peak") and raws["peak"][r["precision"]]["tflops"]
    sheet = datasheet_bf16_tflops((raws.get("versions") or {}).get("device_name", ""))
    kernels = r.get("kernels") or {}
    return {
        "status": r["status"],
        "steps": r["steps_completed"],
        "norm_impl": r["norm_impl"],
        "precision": r["precision"],
        "compile": r["config"]["compile"],
        "tokens_per_s": r.get("tokens_per_s"),
        "step_time_ms_median": r.get("step_time_ms_median"),
        "final_val_loss": r.get("final_val_loss"),
        "achieved_tflops": achieved,
        "measured_tflops": measured or None,
        "datasheet_tflops": sheet,
        "mfu_measured": _ratio(achieved, measured),
        "mfu_datasheet": _ratio(achieved, sheet) if r["precision"] == "bf16" else None,
        "kernels": {
            pos: f"{k['impl_class'].rsplit('.', 1)[-1]} ({k['backend']})"
            for pos, k in kernels.items()
        },
    }


def _step(r: dict, _) -> dict:
    return {
        "a": r["a"]["norm"],
        "b": r["b"]["norm"],
        "a_ms": r["a"]["median_ms"],
        "b_ms": r["b"]["median_ms"],
        "b_over_a": r["ratio"]["median"],
        "b_over_a_iqr": [r["ratio"]["p25"], r["ratio"]["p75"]],
        "pairs": r.get("pairs"),
        "complete": r.get("complete", True),
    }


FIGURES = {
    "versions": lambda r, _: r,
    "contract": _contract,
    "bench": _bench,
    "peak": _peak,
    "train_fused": _train,
    "train_compiled": _train,
    "step": _step,
}


def summarize(steps: list[dict]) -> list[dict]:
    """Each step's ``figures`` from its raw output (``raw``, dropped); a raw output that lacks a key
    fails the step with the reason. A contract with a failed case, no passed case or a case
    reported twice fails; the train steps' MFU uses the peak and versions steps' outputs."""
    raws = {s["name"]: s.get("raw") for s in steps}
    for s in steps:
        raw = s.pop("raw", None)
        try:
            s["figures"] = FIGURES[s["name"]](raw, raws) if raw is not None else {}
        except (KeyError, TypeError, ValueError) as e:
            s |= {"status": "failed", "error": f"unexpected output: {type(e).__name__}: {e}"}
            s["figures"] = {}
        o = s["figures"] if s["name"] == "contract" and s["status"] == "ok" else None
        if o is not None and (o.get("failed") or not o.get("passed") or o.get("twice")):
            s["status"] = "failed"
            s["error"] = (
                f"{len(o['twice'])} case(s) reported twice"
                if o.get("twice")
                else f"{len(o['failed'])} case(s) failed"
                if o.get("failed")
                else "no case passed"
            )
    return steps


def steps_ok(steps: list[dict]) -> bool:
    """Every step of ``STEPS`` ran and is ok (``steps`` summarized)."""
    return len(steps) == len(STEPS) and all(s["status"] == "ok" for s in steps)


def _num(v, spec: str = ".3g") -> str:
    return "-" if v is None else format(v, spec)


def _header(report: dict, fig: dict) -> list[str]:
    v = fig.get("versions") or {}
    shown = ("python", "torch", "cuda", "triton", "hydra")
    dry = report["dry_run"]
    ok = steps_ok(report["steps"])
    cap = v.get("capability")
    return [
        f"# normlab GPU check{' (dry run on CPU)' if dry else ''}",
        "",
        f"Device: {v.get('device_name', '?')} ({report['device']}"
        f"{f', compute capability {cap[0]}.{cap[1]}' if cap else ''}); "
        + ", ".join(f"{k} {v.get(k)}" for k in shown),
        "",
        f"Code: commit {v.get('commit') or 'unknown'}, kit sources {v.get('kit_sources') or '-'}; "
        f"normlab from {v.get('normlab', '?')}; kit installed in {v.get('kit_install_s') or '-'} s",
        "",
        f"Started {report['started']}, {report['seconds']:.0f} s in all; "
        f"{'all steps ok' if ok else 'SOME STEPS FAILED OR DID NOT RUN'}.",
        "",
        *(
            ["Dry run: this CPU at tiny sizes, whole-model compile off; CPU figures.", ""]
            if dry
            else []
        ),
        "| step | status | seconds | command |",
        "|---|---|---|---|",
        *(
            f"| {s['name']} | {s['status']}{f' ({e})' if (e := s.get('error')) else ''} | "
            f"{s['seconds']:.1f} | {f'`{c}`' if (c := s['command']) else '-'} |"
            for s in report["steps"]
        ),
    ]


def _contract_md(o: dict) -> list[str]:
    lines = [
        "",
        f"**Norm contract on the device**: {o['passed']}/{o['cases']} cases passed "
        f"({', '.join(f'{k} {n}' for k, n in sorted(o['passed_by_impl'].items()))}), "
        f"{o['skipped']} skipped; failed: {', '.join(o['failed']) or 'none'}",
    ]
    lines += [f"- `{case}`: {err}" for case, err in o["errors"].items()]
    return lines + [f"- reported twice: `{case}`" for case in o["twice"]]


def _bench_md(b: dict) -> list[str]:
    lines = [
        "",
        "**Norm kernels** (median ms; fraction of the copy's GB/s)"
        + ("" if b["complete"] else "; stopped before its last group"),
        "",
        "| case | fwd ms | fwd %copy | f+b ms | f+b %copy |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['case']} | {r['fwd_ms']:.4f} | {r['fwd_copy_frac']:.0%} | "
        f"{r['fwdbwd_ms']:.4f} | {r['fwdbwd_copy_frac']:.0%} |"
        for r in b["rows"]
    ]
    return [*lines, "\nCopy GB/s: " + ", ".join(f"{k} {g:.1f}" for k, g in b["copy_gbps"].items())]


def _train_md(name: str, t: dict, graph_breaks: dict | None) -> list[str]:
    lines = [
        "",
        f"**{name}** ({t['steps']} steps, {t['precision']}, "
        f"compile {'on' if t['compile'] else 'off'}, norm "
        f"{t['norm_impl']}, {t['status']}): {_num(t['tokens_per_s'], ',.0f')} tokens/s, median "
        f"step {_num(t['step_time_ms_median'], '.1f')} ms, {_num(t['achieved_tflops'], '.1f')} "
        f"TFLOP/s: MFU {_num(t['mfu_datasheet'], '.1%')} of the datasheet's dense bf16 "
        f"{_num(t['datasheet_tflops'], 'g')} TFLOP/s, {_num(t['mfu_measured'], '.1%')} of the "
        f"measured {_num(t['measured_tflops'], '.3g')}; final val loss "
        f"{_num(t['final_val_loss'], '.4f')}",
        "",
        "Kernels: " + ", ".join(f"{pos} {k}" for pos, k in t["kernels"].items()),
    ]
    if graph_breaks is not None:
        lines.append(f"\nGraph breaks: {graph_breaks['count']}")
        lines += [f"- {w}" for w in graph_breaks["where"]]
    return lines


def render(report: dict) -> str:
    """The markdown of a summarized report: header, step table, each step's figures."""
    steps = {s["name"]: s for s in report["steps"]}
    fig = {n: s.get("figures") or {} for n, s in steps.items()}
    lines = _header(report, fig)
    if o := fig.get("contract"):
        lines += _contract_md(o)
    if b := fig.get("bench"):
        lines += _bench_md(b)
    if p := fig.get("peak"):
        lines += [
            "",
            f"**Matmul peak** (measured): fp32 {p['fp32_tflops']:.2f} TFLOP/s, "
            f"bf16 {p['bf16_tflops']:.2f} TFLOP/s",
        ]
    for name in ("train_fused", "train_compiled"):
        if t := fig.get(name):
            lines += _train_md(name, t, steps[name].get("graph_breaks"))
    if st := fig.get("step"):
        lines.append(
            f"\n**Step bench** (median per optimizer step, {st['pairs']} pairs"
            f"{'' if st['complete'] else ', stopped before its last pair'}): "
            f"A {st['a']} {st['a_ms']:.1f} ms, "
            f"B {st['b']} {st['b_ms']:.1f} ms: B/A {st['b_over_a']:.3f} (IQR "
            f"{st['b_over_a_iqr'][0]:.3f}-{st['b_over_a_iqr'][1]:.3f}; below 1: B is faster)"
        )
    if report.get("rental"):
        lines += ["", "**Over the rental's limits**:", *(f"- {p}" for p in report["rental"])]
    return "\n".join(lines) + "\n"


def _archive(work: Path) -> bytes:
    """Every file under ``work`` but run dirs' ``LEFT_OUT`` folders, each cut to its last
    ``MAX_MEMBER_BYTES``, as a gzipped tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for f in sorted(work.rglob("*")):
            rel = f.relative_to(work)
            if not f.is_file() or f.is_symlink() or LEFT_OUT & set(rel.parts):
                continue
            st = f.stat()
            with f.open("rb") as src:
                src.seek(max(0, st.st_size - MAX_MEMBER_BYTES))
                data = src.read(MAX_MEMBER_BYTES)
            info = tarfile.TarInfo(rel.as_posix())
            info.size, info.mtime = len(data), int(st.st_mtime)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def pack(out: Path, work: Path, report: dict) -> dict:
    """Write ``PACKED`` into ``out`` from ``report`` (steps with ``raw``) and ``work``; each file is
    replaced whole, so a kill leaves the previous pack. Returns the summarized report."""
    done = copy.deepcopy(report)
    done["steps"] = summarize(done["steps"])
    _write(out / "logs.tar.gz", _archive(work))
    _write(out / "gpu_check.json", json.dumps(done, indent=1).encode())
    _write(out / "gpu_check.md", render(done).encode())
    return done


def rental_problems(out: Path, report: dict) -> list[str]:
    """What would not come back from ``out``: over ``MAX_FILES`` files, deeper than ``MAX_DEPTH``
    levels, a file over ``MAX_FILE_BYTES``, an ok step whose output is not in the archive."""
    found = list(out.rglob("*"))
    files = [f for f in found if f.is_file()]
    problems = [f"{len(files)} files in {out}, over {MAX_FILES}"] if len(files) > MAX_FILES else []
    problems += [
        f"{f.relative_to(out)} is {len(f.relative_to(out).parts)} levels deep, over {MAX_DEPTH}"
        for f in found
        if len(f.relative_to(out).parts) > MAX_DEPTH
    ]
    problems += [
        f"{f.relative_to(out)} is {f.stat().st_size} bytes, over {MAX_FILE_BYTES}"
        for f in files
        if f.stat().st_size > MAX_FILE_BYTES
    ]
    try:
        with tarfile.open(out / "logs.tar.gz") as tar:
            members = set(tar.getnames())
    except (OSError, tarfile.TarError) as e:
        return [*problems, f"logs.tar.gz cannot be read: {e}"]
    problems += [
        f"step {s['name']} is ok but {WRITES[s['name']]} is not in logs.tar.gz"
        for s in report["steps"]
        if s["status"] == "ok" and WRITES[s["name"]] not in members
    ]
    return problems
