"""The studies: every experiment file composes, the report's diagnostics and swept-value sections
from synthetic metrics, the fp16 study's detector and error sweep, and the norm_cost breakdown."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from normlab.bench.step import build_setup
from normlab.commands import overrides as cli_overrides
from normlab.commands.overrides import check_overrides, expand
from normlab.commands.report import main as report_main
from normlab.compose import compose_cli, find_conf_dir, to_train_config
from normlab.config import ModelConfig, NormConfig, NormImpl, NormKind
from normlab.model import GPT
from normlab.norms import resolve_norm
from normlab.report.diagnostics import write_diag_figures
from normlab.report.swept import swept_numeric
from normlab.studies.fp16_statistics import first_broken, model_check, norm_cases, norm_error_sweep
from normlab.studies.norm_cost import CATEGORIES, ModuleTimer, breakdown, hooked_step

from ..conftest import TINY
from ..report.test_report import make_sweep, write_run

CONF = Path(__file__).resolve().parents[2] / "conf" / "experiment"
STUDIES = ["placement_warmup", "fp16_statistics", "eps_sweep", "norm_cost"]
EXPERIMENTS = sorted(p.stem for p in CONF.glob("*.yaml"))


def sweeps(name: str) -> dict[str, str]:
    """``key -> values`` (Hydra's comma list) that ``conf/experiment/<name>.yaml`` sweeps."""
    hydra = yaml.safe_load((CONF / f"{name}.yaml").read_text()).get("hydra") or {}
    return {k: str(v) for k, v in ((hydra.get("sweeper") or {}).get("params") or {}).items()}


SWEEPING = [name for name in EXPERIMENTS if sweeps(name)]


@pytest.mark.parametrize("name", SWEEPING)
def test_every_value_an_experiment_sweeps_passes_trains_checks_and_reaches_the_config(
    name, monkeypatch
):
    """What ``train experiment=<name>`` runs: each swept value names a real key or option, has
    the key's type and range (train's up-front check), and changes the composed config."""
    # a GPU or the Hub is the machine's to have, not the file's: not checked here
    monkeypatch.setattr(cli_overrides, "check_needs", lambda full: None)
    params = sweeps(name)
    swept = [f"{k}={v}" for k, v in params.items()]
    check_overrides(["-m", f"experiment={name}", *swept], find_conf_dir())
    for key, values in params.items():
        jobs = expand([f"{key}={values}"])
        composed = {repr(compose_cli([f"experiment={name}", *job])) for job in jobs}
        assert len(composed) == len(jobs) >= 2, f"{name}: {key}={values} must vary the config"


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_a_recipe_sized_for_a_gpu_declares_device_cuda(name):
    """A file named ``*_gpu``, or one that sets a GPU's matmul peak, says ``device: cuda``, so
    that ``train`` refuses it at once on a machine without one (``cli_overrides.check_needs``)."""
    cfg = compose_cli([f"experiment={name}"])
    gpu_peak = isinstance(cfg.peak_tflops, int | float) and cfg.peak_tflops > 100
    if name.endswith("_gpu") or gpu_peak:
        assert cfg.device == "cuda"
    else:
        assert cfg.device in ("cpu", "auto")


@pytest.mark.parametrize("name", STUDIES)
def test_each_study_has_a_gpu_variant_beside_it(compose_cfg, name):
    cpu, gpu = (
        to_train_config(compose_cfg([f"experiment={name}"])),
        to_train_config(compose_cfg([f"experiment={name}_gpu"])),
    )
    assert gpu.device == "cuda" and cpu.device in ("cpu", "auto")


# --- report: diagnostics and swept-value sections
# --------------------------------------------------


def diag_row(step: int, n: int, growth: float, gain: float) -> dict:
    row = {f"diag/block{i}/resid_rms": 0.05 * growth**i for i in range(n)}
    row |= {f"diag/block{i}/resid_mean": 0.0 for i in range(n)}
    row["diag/final/resid_rms"] = 0.05 * growth**n
    for name in [f"block{i}/{m}" for i in range(n) for m in ("attn_in", "mlp_in")] + ["final/norm"]:
        row |= {
            f"diag/{name}_gain_mean": gain,
            f"diag/{name}_gain_min": gain - 0.2,
            f"diag/{name}_gain_max": gain + 0.3,
        }
    return row | {"diag/max_logit": 4.0, "diag/block0/grad_norm": 0.1}


def add_diag(run_dir: Path, n: int = 2, growth: float = 2.0, upto: int = 20) -> None:
    """Add diag/ keys to every 5th row of a synthetic run's metrics.jsonl (rows after ``upto``
    dropped)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [
        r | (diag_row(r["step"], n, growth, 1 + r["step"] / 100) if r["step"] % 5 == 0 else {})
        for r in rows
        if r["step"] <= upto
    ]
    if upto < 20:
        rows[-1]["diag/block1/resid_rms"] = float("nan")  # a diverging run's last statistics
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_report_draws_residual_rms_vs_depth_and_gains_when_diag_keys_exist(tmp_path):
    sweep = make_sweep(tmp_path / "sweep")
    for d in sweep.iterdir():
        if d.is_dir():
            add_diag(d, growth=2.0 if d.name.startswith("layer") else 1.2)
    add_diag(write_run(sweep, "rms", 3, None, status="diverged"), upto=10)
    assert report_main([str(sweep), "--margin", "0.05"]) == 0
    out = sweep / "report"
    md = (out / "report.md").read_text()
    for name in ("resid_depth.png", "gains.png"):
        png = out / name
        assert png.stat().st_size > 5000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name})" in md
    diag = md.split("## Diagnostics")[1]
    # layer: 0.05 entering block 0, 0.05 * 2^2 = 0.2 entering the final norm: growth 4
    assert (
        "| `norm=layer` | 3 | 5–20 | 0.2 | 0.05 | 0.2 | 4.00 | 1.000–1.500 | 4 |" in diag
    )  # gain 1.2 at step 20
    assert (
        "| `norm=rms (excluded)` | 1 | 5–10 |" in diag
    )  # the diverged run's diagnostics, kept apart
    assert "## Outcome per variant" in md and "seed 3: diverged at step 7" in md


def test_no_diagnostics_section_or_figures_without_diag_keys(tmp_path):
    sweep = make_sweep(tmp_path / "sweep")
    assert report_main([str(sweep)]) == 0
    md = (sweep / "report" / "report.md").read_text()
    assert "## Diagnostics" not in md and not (sweep / "report" / "resid_depth.png").exists()
    assert write_diag_figures({"a": [[{"step": 1, "train/loss": 3.0}]]}, tmp_path) == {
        "resid_depth": None,
        "gains": None,
    }


def test_swept_numeric_override_gets_a_pivot_table_and_figure(tmp_path):
    eps = {"1e-08": 3.00, "1e-05": 3.01, "0.01": 3.20}
    for norm in ("layer", "rms"):
        for i, (e, loss) in enumerate(eps.items()):
            write_run(
                tmp_path,
                norm,
                0,
                loss + (0.05 if norm == "rms" else 0),
                name=f"{norm}-{i}",
                edits={"norm.eps": float(e)},
                overrides=[f"norm={norm}", f"norm.eps={e}", "seed=0"],
            )
    assert report_main([str(tmp_path), "--baseline", "norm=layer,norm.eps=1e-05"]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "Baseline: `norm.eps=1e-05,norm=layer`" in md
    section = md.split("## Final validation loss vs `norm.eps`")[1]
    assert "| 0.01 | 3.2000 (n = 1) | 3.2500 (n = 1) |" in section
    assert (tmp_path / "report" / "swept.png").stat().st_size > 5000
    assert (
        "one seed paired with the baseline (0): difference +0.1900" in md
    )  # n = 1 reads as one sentence
    assert swept_numeric(["norm=layer", "norm=rms"]) is None
    key, where = swept_numeric(
        ["norm.placement=pre,optim.warmup_steps=0", "norm.placement=post,optim.warmup_steps=50"]
    )
    assert key == "optim.warmup_steps" and where["norm.placement=post,optim.warmup_steps=50"] == (
        50.0,
        "norm.placement=post",
    )


# --- fp16 statistics ------------------------------------------------------------------------------


def tiny_gpt(upcast: bool) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(name="t", n_layer=2, n_head=2, d_model=16, context_length=8, vocab_size=32)
    return GPT(
        cfg,
        resolve_norm(NormConfig(kind=NormKind.rms, impl=NormImpl.reference, upcast=upcast), "cpu"),
    ).eval()


def test_fp16_detector_names_the_first_overflowing_norm_only_without_fp32_statistics():
    x = torch.arange(16).view(2, 8) % 32
    y = (x + 1) % 32
    for upcast in (False, True):
        model = tiny_gpt(upcast)
        ref = model.double()
        model = tiny_gpt(upcast)
        res = model_check(model.half(), ref, x, y, target_rms=300.0)
        assert res["max_abs"] > 255.9
        if not upcast:
            assert (
                res["first_module"] == "blocks.0.attn_in"
                and "statistics of blocks.0.attn_in" in res["first_nonfinite"]
            )
            assert (
                res["overflowed_norms"][0] == "blocks.0.attn_in" and res["logit_err_median"] > 0.5
            )  # rows zeroed
        else:
            assert (
                res["first_nonfinite"] is None
                and res["overflowed_norms"] == []
                and res["logit_err_max"] < 0.05
            )
    # fp16 autocast keeps the residual stream fp32: the norms never see fp16 inputs
    res = model_check(
        tiny_gpt(False), tiny_gpt(False).double(), x, y, target_rms=300.0, autocast=True
    )
    assert res["first_nonfinite"] is None and res["overflowed_norms"] == []
    # below the threshold the fp16 model is fine either way
    assert (
        model_check(tiny_gpt(False).half(), tiny_gpt(False).double(), x, y, target_rms=10.0)[
            "first_nonfinite"
        ]
        is None
    )


def test_fp16_norm_sweep_breaks_only_without_upcast_and_above_the_threshold():
    cases = norm_cases("cpu", ["reference"])
    assert [c for c, _ in cases] == [
        "rms/reference upcast=true",
        "rms/reference upcast=false",
        "layer/reference upcast=true",
        "layer/reference upcast=false",
    ]
    sweep = norm_error_sweep(
        cases, ["fp16", "bf16"], [1.0, 50.0, 300.0], rows=16, d=64, device=torch.device("cpu")
    )
    assert first_broken(sweep, "rms/reference upcast=false", "fp16") == 300.0
    assert first_broken(sweep, "layer/reference upcast=false", "fp16") == 300.0
    assert first_broken(sweep, "rms/reference upcast=true", "fp16") is None
    assert (
        first_broken(sweep, "rms/reference upcast=false", "bf16") is None
    )  # bf16 has fp32's range
    r = next(
        r
        for r in sweep
        if r["case"] == "rms/reference upcast=false" and r["dtype"] == "fp16" and r["rms"] == 300.0
    )
    assert r["stats_overflow_frac"] == 1.0 and r["err_median"] == pytest.approx(
        1.0
    )  # zeroed, not NaN


# --- norm_cost ------------------------------------------------------------------------------------


def test_breakdown_sums_to_the_step_time():
    ms = {
        ("norm", "fwd"): 1.0,
        ("norm", "bwd"): 2.0,
        ("attention", "fwd"): 3.0,
        ("mlp", "bwd"): 4.0,
    }
    b = breakdown(ms, fwd_ms=10.0, bwd_ms=20.0, total_ms=35.0)
    assert (b["norm"], b["attention"], b["mlp"], b["other"], b["optimizer"]) == (
        3.0,
        3.0,
        4.0,
        20.0,
        5.0,
    )
    assert sum(b[c] for c in CATEGORIES) == 35.0


def test_norm_cost_aggregation_sums_to_the_total_on_a_tiny_model():
    setup = build_setup([*TINY, "norm.impl=torch"])
    model = setup.run.model
    timer = ModuleTimer(model, setup.run.device)
    b = hooked_step(setup, timer)
    assert (
        setup.step == 1 and model.blocks[0].attn.qkv.weight.grad is None
    )  # a full step, zero_grad done
    assert math.isclose(sum(b[c] for c in CATEGORIES), b["total"], rel_tol=1e-9)
    assert (
        all(b[c] >= 0 for c in CATEGORIES)
        and b["norm"] > 0
        and b["other_fwd"] >= 0
        and b["other_bwd"] >= 0
    )
    # every norm (2 per block + final), attention and MLP timed once forward and once backward
    assert dict(timer.calls) == {
        ("norm", "fwd"): 5,
        ("norm", "bwd"): 5,
        ("attention", "fwd"): 2,
        ("attention", "bwd"): 2,
        ("mlp", "fwd"): 2,
        ("mlp", "bwd"): 2,
    }
    assert all(
        not m._forward_hooks and not m._backward_hooks for m in model.modules()
    )  # hooks removed
