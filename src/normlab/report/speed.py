"""The speed verdict from the interleaved step benchmark (``normlab-bench step --a ... --b ...
--json <sweep>/step_bench.json``): both setups in one process, timed in pairs A B, B A, ..., so
a machine that changes speed slows both alike. Its per-pair ratios give the step-time ratio
variant / baseline; the sweep's sequential step times are the secondary figure.

Reads JSON only; ratios are dimensionless, times in ms.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from normlab.report.runs import ReportError
from normlab.report.stats import ratio_interval

BENCH_FILE = "step_bench.json"


def load_step_bench(sources: list[Path]) -> tuple[Path, dict[str, Any]] | None:
    """The first ``step_bench.json`` found in a source dir of the report, with its path; None
    when there is none.

    Raises:
        ReportError: the file is not JSON, or not a ``normlab-bench step`` result (``mode`` "step"
            with ``a``, ``b`` and ``ratio.per_pair``).
    """
    for src in sources:
        path = Path(src) / BENCH_FILE
        if not path.is_file():
            continue
        try:
            bench = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ReportError(f"cannot read {path}: {e.msg} (line {e.lineno})") from None
        ok = isinstance(bench, dict) and bench.get("mode") == "step"
        ok = ok and all(isinstance(bench.get(k), dict) for k in ("a", "b", "ratio"))
        if not ok or not bench["ratio"].get("per_pair"):
            raise ReportError(
                f"cannot read {path}: not a `normlab-bench step` result (mode 'step' with a, b "
                "and ratio.per_pair)"
            )
        return path, bench
    return None


def _matches(setup: dict[str, Any], common: list[str], label: str) -> bool:
    """True when every override of the variant ``label`` is among the setup's overrides."""
    given = {*setup.get("overrides", []), *common}
    return set(label.split(",")) <= given


def bench_ratio(bench: dict[str, Any], baseline: str, label: str, alpha: float) -> dict | None:
    """The interleaved ratio variant / baseline step time: ``median`` of the per-pair ratios and
    their geometric mean with the 1−alpha Student t CI on logs (:func:`ratio_interval`), ``pairs``,
    both medians (ms), device and threads. The setups are matched to the labels by overrides
    (B/A when A is the baseline, A/B inverted when B is); None when neither way matches."""
    common = bench.get("common", [])
    a, b = bench["a"], bench["b"]
    per = np.asarray(bench["ratio"]["per_pair"], float)
    if _matches(a, common, baseline) and _matches(b, common, label):
        base, var = a, b
    elif _matches(b, common, baseline) and _matches(a, common, label):
        base, var, per = b, a, 1 / per
    else:
        return None
    per = per[np.isfinite(per) & (per > 0)]
    p25, med, p75 = (float(v) for v in np.percentile(per, [25, 50, 75]))
    return {
        **ratio_interval(list(per), alpha),
        "median": med,
        "iqr": (p25, p75),
        "pairs": int(per.size),
        "baseline_ms": base.get("median_ms"),
        "variant_ms": var.get("median_ms"),
        "device": bench.get("device"),
        "threads": bench.get("threads"),
    }
