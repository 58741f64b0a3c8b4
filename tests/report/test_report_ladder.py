"""The model-size ladder (normlab.report.ladder): the fitted loss-compute law on points drawn from
a known power law, the trend of the compute multiplier across sizes (none when the multiplier is
the same at every size, found when it grows), and the ladder report a sweep over sizes gets."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from normlab.commands.report import main
from normlab.report import ReportError, build_ladder, load_runs
from normlab.report.ladder import (
    TARGET_PARAMS,
    fit_power_law,
    is_ladder,
    law_value,
    multiplier_trend,
    training_flops,
)

from .test_report import write_run

#: (n_layer, d_model, n_head, params): the CPU ladder's rungs (conf/ladder/cpu_*.yaml)
SIZES = [(2, 48, 2, 68928), (3, 64, 2, 166464), (3, 96, 3, 360288), (4, 128, 4, 826112)]
CTX, TOKENS_PER_STEP = 128, 1024
#: the baseline's final loss against compute: L = E + A (C / 1e12)^-alpha
LAW = {"E": 1.3, "A": 1.0, "alpha": 0.3}


def true_law(compute: float) -> float:
    return LAW["E"] + LAW["A"] * (compute / 1e12) ** -LAW["alpha"]


def flops(size: tuple[int, int, int, int]) -> tuple[int, float]:
    """Steps (tokens = 2 x params) and training FLOPs of a rung: (6 N + 12 L d T) x tokens."""
    layers, width, _, n = size
    steps = round(2 * n / TOKENS_PER_STEP)
    return steps, (6 * n + 12 * layers * width * CTX) * steps * TOKENS_PER_STEP


def ladder_run(root, norm, size, seed, shift, rng, noise=0.002):
    """A run dir of one rung whose validation curve ends at the law's loss for the baseline
    (``shift`` = 1) and is the baseline's curve stretched in steps by ``shift`` for a variant
    (it needs ``shift`` x the steps: a compute multiplier of 1 / shift at equal step times)."""
    layers, width, heads, n = size
    steps, compute = flops(size)
    edits = {"model.n_layer": layers, "model.d_model": width, "model.n_head": heads}
    edits |= {"model.context_length": CTX, "max_steps": steps}
    ovr = [f"norm={norm}", f"seed={seed}", f"ladder=cpu_{layers}x{width}"]
    d = write_run(
        root, norm, seed, 0.0, edits=edits, overrides=ovr, name=f"{layers}x{width}-{norm}-{seed}"
    )
    at = np.linspace(0, steps, 17)
    tau = steps / 10
    loss = true_law(compute) + 2.0 * ((1 + at / (shift * tau)) ** -0.5 - (1 + steps / tau) ** -0.5)
    loss = loss + rng.normal(0, noise, size=loss.shape)
    rows = [{"step": int(s), "val/loss": v, "train/loss": v} for s, v in zip(at, loss, strict=True)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = json.loads((d / "summary.json").read_text())
    s |= {"final_val_loss": float(loss[-1]), "params": n, "tokens_per_step": TOKENS_PER_STEP}
    s |= {"steps_completed": steps, "max_steps": steps}
    (d / "summary.json").write_text(json.dumps(s))
    return d


def ladder_sweep(root, shifts, seeds=3, noise=0.002):
    """LayerNorm and RMSNorm at every rung of SIZES; RMSNorm stretched by ``shifts[i]`` at
    rung i."""
    rng = np.random.default_rng(0)
    (root / "multirun.yaml").parent.mkdir(parents=True, exist_ok=True)
    (root / "multirun.yaml").write_text("hydra: {}\n")
    for size, shift in zip(SIZES, shifts, strict=True):
        for seed in range(seeds):
            ladder_run(root, "layer", size, seed, 1.0, rng, noise)
            ladder_run(root, "rms", size, seed, shift, rng, noise)
    return root


# --- the power law -------------------------------------------------------------------------------


def test_points_from_a_known_power_law_recover_alpha_within_its_ci():
    rng = np.random.default_rng(3)
    compute = np.repeat(np.logspace(10.5, 13.5, 6), 2)
    loss = true_law(compute) + rng.normal(0, 0.003, size=compute.shape)
    law = fit_power_law(list(compute), list(loss))
    assert law["form"] == "E + A (C/C0)^-alpha" and law["why"] is None
    lo, hi = law["alpha_ci"]
    assert lo < LAW["alpha"] < hi and hi - lo < 0.2  # recovered, and the interval says something
    assert law["E"] == pytest.approx(LAW["E"], abs=3 * law["se"]["E"])
    assert law_value(law, np.array([1e12]))[0] == pytest.approx(true_law(1e12), abs=0.01)


def test_without_a_loss_floor_the_law_falls_back_to_a_straight_line_in_log_log_and_says_why():
    rng = np.random.default_rng(4)
    compute = np.logspace(10, 14, 8)
    loss = 3.0 * (compute / 1e12) ** -0.1 * np.exp(rng.normal(0, 0.002, size=compute.shape))
    law = fit_power_law(list(compute), list(loss))
    assert law["form"] == "A (C/C0)^-alpha" and "E" in law["why"] and math.isnan(law["E"])
    assert law["alpha_ci"][0] < 0.1 < law["alpha_ci"][1]


def test_three_points_get_the_two_parameter_law_and_too_few_are_refused():
    law = fit_power_law([1e10, 1e11, 1e12], [3.0, 2.5, 2.1])
    assert law["form"] == "A (C/C0)^-alpha" and law["dof"] == 1 and "3 points" in law["why"]
    with pytest.raises(ReportError, match=">= 2 runs at 2 computes"):
        fit_power_law([1e10, 1e10], [3.0, 2.9])


# --- the multiplier trend ------------------------------------------------------------------------


def test_a_multiplier_that_grows_with_size_gives_a_slope_ci_excluding_zero():
    params = [7e4, 1.7e5, 3.6e5, 8.3e5]
    rng = np.random.default_rng(5)
    ks = [p**0.1 * math.exp(rng.normal(0, 0.01)) / 3 for p in params]
    t = multiplier_trend(params, ks, [0.01] * 4)
    assert t["weighted"] and t["slope_ci"][0] > 0 and t["slope_ci"][0] < 0.1 < t["slope_ci"][1]
    assert t["at_target"]["beyond"] == pytest.approx(TARGET_PARAMS / 8.3e5)
    want = TARGET_PARAMS**0.1 / 3
    assert t["at_target"]["ci"][0] < want < t["at_target"]["ci"][1]


def test_two_sizes_give_a_slope_but_no_interval():
    t = multiplier_trend([1e5, 1e6], [1.0, 1.1], [0.01, 0.01])
    assert t["slope"] == pytest.approx(math.log(1.1) / math.log(10))
    assert all(map(math.isnan, t["slope_ci"])) and all(map(math.isnan, t["at_target"]["ci"]))


def test_a_fixed_multiplier_across_sizes_gives_a_trend_slope_ci_containing_zero(tmp_path):
    lad = build_ladder(ladder_sweep(tmp_path, [1.05] * 4))
    assert [s["shape"] for s in lad.sizes] == ["2x48", "3x64", "3x96", "4x128"]
    assert lad.baseline == "norm=layer" and lad.labels == ["norm=layer", "norm=rms"]
    t = lad.trends["norm=rms"]
    assert t["n"] == 4 and t["weighted"]
    assert t["slope_ci"][0] < 0 < t["slope_ci"][1]
    for row in t["sizes"]:  # each size recovers 1 / 1.05 within its CI
        assert row["ci"][0] < 1 / 1.05 < row["ci"][1]
    assert t["at_target"]["ci"][0] < 1 / 1.05 < t["at_target"]["ci"][1]


def test_the_ladder_fits_each_kinds_law_on_training_compute(tmp_path):
    lad = build_ladder(ladder_sweep(tmp_path, [1.05] * 4))
    run = next(r for r in load_runs([tmp_path]) if r.path.name.startswith("4x128-layer"))
    assert training_flops(run) == pytest.approx(flops(SIZES[3])[1])
    pts = lad.points["norm=layer"]
    assert len(pts) == 12 and {p["shape"] for p in pts} == {"2x48", "3x64", "3x96", "4x128"}
    law = lad.laws["norm=layer"]
    assert law["alpha_ci"][0] < LAW["alpha"] < law["alpha_ci"][1]


def test_a_sweep_over_sizes_is_a_ladder_and_one_over_sizes_only_is_not(tmp_path):
    assert is_ladder(load_runs([ladder_sweep(tmp_path / "a", [1.0] * 4, seeds=1)]))
    rng = np.random.default_rng(0)
    for size in SIZES[:2]:
        ladder_run(tmp_path / "b", "layer", size, 0, 1.0, rng)
    assert not is_ladder(load_runs([tmp_path / "b"]))


# --- the command ---------------------------------------------------------------------------------


def test_normlab_report_on_a_sweep_over_sizes_writes_the_ladder_report(tmp_path, capsys):
    sweep = ladder_sweep(tmp_path / "sweep", [1.0, 1.05, 1.1, 1.2], seeds=2)
    assert main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "(a ladder of 4 model sizes)" in out and "norm=rms: trend k ~ N^-" in out
    assert "at 124M parameters (an extrapolation, 150x beyond the largest size)" in out
    md = (sweep / "report" / "report.md").read_text()
    for section in (
        "## Sizes",
        "## `norm=rms` vs `norm=layer` at each size",
        "## Trend of the multiplier with size",
        "## Final validation loss against training compute",
    ):
        assert section in md
    assert "**k shrinks with size**" in md and "**An extrapolation**, 150x beyond" in md
    assert "| `norm=layer` | E + A (C/C0)^-alpha |" in md
    for shape in ("2x48", "3x64", "3x96", "4x128"):  # each size's own report, linked
        assert f"[{shape}]({shape}/report.md)" in md
        assert (
            "## Compute-equivalent verdict" in (sweep / "report" / shape / "report.md").read_text()
        )
    for fig in ("ladder_loss.png", "ladder_multiplier.png"):
        assert (sweep / "report" / fig).stat().st_size > 10_000 and f"]({fig})" in md


def test_a_ladder_refuses_the_options_of_one_comparison_and_plan(tmp_path, capsys):
    sweep = ladder_sweep(tmp_path / "sweep", [1.0] * 4, seeds=2)
    assert main([str(sweep), "--wandb"]) == 2
    assert "--wandb: these runs are a ladder" in capsys.readouterr().err
    assert main([str(sweep), "--plan", "0.01"]) == 1
    assert "plan on one size's run dirs" in capsys.readouterr().err
    assert not (sweep / "report").exists()
