"""The model-size ladder (normlab.report.ladder): the fitted loss-compute law on points drawn from
a known power law, fitted to size means with its lack-of-fit test and leave-largest-out prediction,
the trend of the step multiplier across sizes (none when it is the same at every size, found when
it grows; no 124M value unless the laws pass), the sizes every law spans (those left out named),
and the ladder report a sweep over sizes gets, with a margin per size under --margin-compute."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import optimize, stats

from normlab.commands.report import main
from normlab.report import ReportError, build_ladder, ladder, load_runs, write_ladder_figures
from normlab.report.compare import margin_from_compute
from normlab.report.ladder import is_ladder, training_flops
from normlab.report.laws import (
    FULL,
    PURE,
    TARGET_PARAMS,
    fit_power_law,
    ladder_law,
    law_value,
    multiplier_trend,
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


def ladder_run(root, norm, size, seed, shift, rng, noise=0.002, step_ms=100.0, bump=0.0, drop=2.0):
    """A run dir of one rung whose validation curve ends at the law's loss (plus ``bump``) for
    the baseline (``shift`` = 1) and is the baseline's curve stretched in steps by ``shift`` for a
    variant (it needs ``shift`` x the steps: a step multiplier of 1 / shift); ``step_ms``: its
    median step time; ``drop``: how far the curve falls (nats), which sets its end slope."""
    layers, width, heads, n = size
    steps, compute = flops(size)
    edits = {"model.n_layer": layers, "model.d_model": width, "model.n_head": heads}
    edits |= {"model.context_length": CTX, "max_steps": steps}
    ovr = [f"norm={norm}", f"seed={seed}", f"ladder=cpu_{layers}x{width}"]
    name = f"{layers}x{width}-{norm}-{seed}"
    d = write_run(root, norm, seed, 0.0, edits=edits, overrides=ovr, name=name, step_ms=step_ms)
    at = np.linspace(0, steps, 17)
    tau = steps / 10
    loss = true_law(compute) + bump
    loss = loss + drop * ((1 + at / (shift * tau)) ** -0.5 - (1 + steps / tau) ** -0.5)
    loss = loss + rng.normal(0, noise, size=loss.shape)
    rows = [{"step": int(s), "val/loss": v, "train/loss": v} for s, v in zip(at, loss, strict=True)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = json.loads((d / "summary.json").read_text())
    s |= {"final_val_loss": float(loss[-1]), "params": n, "tokens_per_step": TOKENS_PER_STEP}
    s |= {"steps_completed": steps, "max_steps": steps}
    (d / "summary.json").write_text(json.dumps(s))
    return d


def ladder_sweep(root, shifts, seeds=3, noise=0.002, rms_ms=None, bumps=None, skip=(), drops=None):
    """LayerNorm and RMSNorm at every rung of SIZES; RMSNorm stretched by ``shifts[i]`` at
    rung i, with a median step time of ``rms_ms[i]`` ms (LayerNorm's: 100); both variants'
    losses raised by ``bumps[i]`` nats, their curves falling by ``drops[i]`` nats (default 2);
    ``skip``: (norm, rung index) pairs not run."""
    rng = np.random.default_rng(0)
    (root / "multirun.yaml").parent.mkdir(parents=True, exist_ok=True)
    (root / "multirun.yaml").write_text("hydra: {}\n")
    rms_ms, bumps = rms_ms or [100.0] * len(SIZES), bumps or [0.0] * len(SIZES)
    drops = drops or [2.0] * len(SIZES)
    for i, (size, shift) in enumerate(zip(SIZES, shifts, strict=True)):
        for seed in range(seeds):
            if ("layer", i) not in skip:
                ladder_run(root, "layer", size, seed, 1.0, rng, noise, bump=bumps[i], drop=drops[i])
            if ("rms", i) not in skip:
                ladder_run(
                    root, "rms", size, seed, shift, rng, noise, rms_ms[i], bumps[i], drops[i]
                )
    return root


# --- the power law -------------------------------------------------------------------------------


def test_points_from_a_known_power_law_recover_alpha_within_its_ci():
    rng = np.random.default_rng(3)
    compute = np.logspace(10.5, 13.5, 12)
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


def test_three_sizes_get_the_two_parameter_law_and_too_few_are_refused():
    law = fit_power_law([1e10, 1e11, 1e12], [3.0, 2.5, 2.1])
    assert law["form"] == PURE and law["dof"] == 1 and "3 sizes" in law["why"]
    with pytest.raises(ReportError, match="needs >= 2 sizes, has 1"):
        fit_power_law([1e10], [3.0])
    with pytest.raises(ReportError, match="needs >= 2 sizes, has 2"):  # one compute twice
        fit_power_law([1e10, 1e10], [3.0, 2.9])


def test_three_sizes_fit_three_parameters_with_no_interval_and_two_sizes_none():
    compute = [1e10, 1e11, 1e12]
    law = fit_power_law(compute, [true_law(c) for c in compute], form=FULL)
    assert law["form"] == FULL and law["dof"] == 0 and law["alpha"] == pytest.approx(0.3, abs=1e-3)
    assert all(map(math.isnan, law["alpha_ci"])) and math.isnan(law["se"]["alpha"])
    assert ladder._law_row("norm=layer", {**law, "runs": 6})[5] == "n/a: 0 df"
    with pytest.raises(ReportError, match=r"E \+ A \(C/C0\)\^-alpha needs >= 3 sizes, has 2"):
        fit_power_law(compute[:2], [3.0, 2.5], form=FULL)
    points = [{"shape": "a", "compute": 1e10, "loss": 3.0}]
    none = ladder_law(points, ["a"], 0.05)
    assert none["form"] is None and none["why"] == "a power law needs >= 2 sizes, has 1"


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


# --- the law over size means, its checks, and what they allow ------------------------------------


@pytest.fixture(scope="module")
def four_by_two(tmp_path_factory):
    """The ladder of 4 sizes x 2 seeds, no difference between the variants."""
    return build_ladder(ladder_sweep(tmp_path_factory.mktemp("ladder"), [1.0] * 4, seeds=2))


def test_a_ladder_at_one_learning_rate_says_so_in_its_header(four_by_two, capsys):
    md = ladder.render_ladder(four_by_two)
    shapes = [s["shape"] for s in four_by_two.sizes]
    line = next(x for x in md.splitlines() if x.startswith("- **Learning rate:**"))
    assert "every variant trained at one learning rate at every size (optim.lr " in line
    assert all(f"{shape}: " in line for shape in shapes) and "judged off its optimum" in line
    four_by_two.sizes[0]["report"].tuned = {"best": {}}  # one size tuned: no such line
    try:
        assert "**Learning rate:**" not in ladder.render_ladder(four_by_two)
    finally:
        four_by_two.sizes[0]["report"].tuned = None


def hand_means(lad, label):
    """Per size of the laws: its compute, and the losses of the variant's runs there."""
    out = []
    for shape in lad.law_sizes:
        pts = [p for p in lad.points[label] if p["shape"] == shape]
        out.append((pts[0]["compute"], [p["loss"] for p in pts]))
    return np.array([c for c, _ in out]), [np.array(ls) for _, ls in out]


def hand_fit(c, y):
    """E + A (C/C0)^-alpha by scipy's unbounded least squares, with its scaled covariance."""
    c0 = math.exp(np.log(c).mean())
    p0 = (LAW["E"], LAW["A"] * (c0 / 1e12) ** -LAW["alpha"], LAW["alpha"])
    p, cov = optimize.curve_fit(lambda x, e, a, al: e + a * x**-al, c / c0, y, p0=p0)
    return p, cov, c0


def test_the_law_is_fitted_to_the_size_means_with_t_on_sizes_minus_parameters(four_by_two):
    c, losses = hand_means(four_by_two, "norm=layer")
    p, cov, _ = hand_fit(c, np.array([ls.mean() for ls in losses]))
    law = four_by_two.laws["norm=layer"]
    assert law["form"] == FULL and (law["n"], law["runs"], law["dof"]) == (4, 8, 1)
    half = stats.t.ppf(0.975, 1) * math.sqrt(cov[2, 2])  # t at 4 sizes − 3 parameters
    assert law["alpha"] == pytest.approx(p[2], rel=1e-4)
    assert law["alpha_ci"] == pytest.approx((p[2] - half, p[2] + half), rel=1e-3)


def test_the_lack_of_fit_f_test_sets_the_means_misfit_against_the_seeds_scatter(four_by_two):
    c, losses = hand_means(four_by_two, "norm=layer")
    means = np.array([ls.mean() for ls in losses])
    p, _, c0 = hand_fit(c, means)
    ss_lof = float(np.sum(2 * (means - (p[0] + p[1] * (c / c0) ** -p[2])) ** 2))
    ss_pe = float(sum(np.sum((ls - ls.mean()) ** 2) for ls in losses))
    f = (ss_lof / 1) / (ss_pe / 4)  # (4 sizes − 3 parameters), (8 runs − 4 sizes)
    lof = four_by_two.laws["norm=layer"]["lof"]
    assert (lof["df_lof"], lof["df_pe"]) == (1, 4)
    assert lof["F"] == pytest.approx(f, rel=1e-3)
    assert lof["p"] == pytest.approx(stats.f.sf(f, 1, 4), rel=1e-3)


@pytest.mark.filterwarnings("ignore::scipy.optimize.OptimizeWarning")  # 0 df: no covariance
def test_leaving_the_largest_size_out_predicts_it_from_the_others(four_by_two):
    c, losses = hand_means(four_by_two, "norm=layer")
    means = np.array([ls.mean() for ls in losses])
    p, _, c0 = hand_fit(c[:3], means[:3])  # 3 sizes, 3 parameters: through the points
    want = p[0] + p[1] * (c[3] / c0) ** -p[2]
    loo = four_by_two.laws["norm=layer"]["loo"]
    assert loo["shape"] == "4x128" and loo["why"] is None
    assert loo["predicted"] == pytest.approx(want, abs=1e-4)
    assert loo["measured"] == pytest.approx(means[3])
    assert loo["error"] == pytest.approx(want - means[3], abs=1e-4)


def test_a_size_missing_a_variant_is_left_out_of_every_law_and_named(tmp_path):
    lad = build_ladder(ladder_sweep(tmp_path, [1.0] * 4, seeds=2, skip={("rms", 2)}))
    assert lad.law_sizes == ["2x48", "3x64", "4x128"]
    assert lad.left_out == {"3x96": "no completed run of norm=rms"}
    for law in lad.laws.values():  # the same sizes for both, so their alphas compare
        assert [m["shape"] for m in law["means"]] == lad.law_sizes and law["n"] == 3
    assert [r["shape"] for r in lad.trends["norm=rms"]["sizes"]] == ["2x48", "3x64", "4x128"]
    md = ladder.render_ladder(lad)
    assert "Left out of every law, so all span the same sizes: 3x96 (no completed run of" in md
    assert "| **no**: no completed run of norm=rms |" in md and "no run of `norm=rms`" in md
    figures = write_ladder_figures(lad, tmp_path)
    assert all(p is not None and p.stat().st_size > 10_000 for p in figures.values())


def test_a_size_where_a_variants_runs_record_no_compute_is_left_out_of_every_law(tmp_path):
    sweep = ladder_sweep(tmp_path, [1.0] * 4, seeds=2)
    for d in sweep.glob("3x96-rms-*"):  # written before summary.json had params: no compute
        s = json.loads((d / "summary.json").read_text())
        (d / "summary.json").write_text(json.dumps({k: v for k, v in s.items() if k != "params"}))
    lad = build_ladder(sweep)
    assert lad.law_sizes == ["2x48", "3x64", "4x128"]
    assert lad.left_out == {"3x96": "no training compute for norm=rms (params or tokens unknown)"}
    for law in lad.laws.values():  # not the baseline over 4 sizes beside the variant over 3
        assert [m["shape"] for m in law["means"]] == lad.law_sizes and law["n"] == 3
    assert "3x96 (no training compute for norm=rms" in ladder.render_ladder(lad)


def test_no_124m_value_when_a_law_misses_the_left_out_largest_size(tmp_path):
    lad = build_ladder(ladder_sweep(tmp_path, [1.0] * 4, seeds=2, bumps=[0, 0, 0, 0.1]))
    assert lad.laws["norm=layer"]["loo"]["error"] < -0.02  # the margin, 0.02 nats
    at = lad.trends["norm=rms"]["at_target"]
    assert "fitted without 4x128" in at["refused"] and "±0.02 margin" in at["refused"]
    assert math.isnan(at["k"]) and all(map(math.isnan, at["ci"]))
    md = ladder.render_ladder(lad)
    assert "at 124M parameters (GPT-2 small, 150x beyond): **no value**: norm=layer's law" in md
    assert "**An extrapolation**" not in md
    assert write_ladder_figures(lad, tmp_path)["ladder_multiplier"] is not None


def test_the_trend_is_of_the_step_multiplier_and_a_speed_ratio_does_not_move_it(tmp_path):
    shifts = [1.0, 1.05, 1.1, 1.2]
    plain = build_ladder(ladder_sweep(tmp_path / "a", shifts, seeds=2))
    fast = build_ladder(ladder_sweep(tmp_path / "b", shifts, seeds=2, rms_ms=[100, 50, 100, 100]))
    c = next(c for c in fast.sizes[1]["report"].comparisons if c["label"] == "norm=rms")
    assert c["compute"]["speed"] == pytest.approx(2.0)  # the rms step is twice as fast at 3x64
    assert c["compute"]["k"] == pytest.approx(2 * c["compute"]["step_mult"])
    t, u = plain.trends["norm=rms"], fast.trends["norm=rms"]
    assert u["slope"] == pytest.approx(t["slope"]) and u["slope_ci"] == pytest.approx(t["slope_ci"])
    assert u["sizes"][1]["m"] == pytest.approx(1 / 1.05, rel=0.02)
    assert "| 3x64 | 2 |" in (md := ladder.render_ladder(fast)) and "| 2.000 | sequential" in md


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
    assert "(a ladder of 4 model sizes)" in out and "norm=rms" in out
    md = (sweep / "report" / "report.md").read_text()
    for section in (
        "## Sizes",
        "## `norm=rms` vs `norm=layer` at each size",
        "## Trend of the step multiplier with size",
        "## Final validation loss against training compute",
    ):
        assert section in md
    assert "**m shrinks with size**" in md and "(GPT-2 small, 150x beyond): m = " in md
    assert "**An extrapolation**, shown because both laws predicted" in md
    assert "| `norm=layer` | E + A (C/C0)^-alpha |" in md and "E (fitted)" in md
    assert "laws are fitted to the 4 size means" in md
    assert "Method: `docs/reports.md#the-ladder-report`." in md
    for shape in ("2x48", "3x64", "3x96", "4x128"):  # each size's own report, linked
        assert f"[{shape}]({shape}/report.md)" in md
        assert (
            "## Compute-equivalent verdict" in (sweep / "report" / shape / "report.md").read_text()
        )
    for fig in ("ladder_loss.png", "ladder_multiplier.png"):
        assert (sweep / "report" / fig).stat().st_size > 10_000 and f"]({fig})" in md


def test_normlab_report_names_the_sizes_the_laws_span_and_those_left_out(tmp_path, capsys):
    sweep = ladder_sweep(tmp_path / "sweep", [1.0] * 4, seeds=2, skip={("rms", 2)})
    assert main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "  margin: ±0.02 nats/token at each size\n" in out
    assert (
        "  laws over the sizes every variant has: 2x48, 3x64, 4x128; left out: 3x96 (no "
        "completed run of norm=rms)\n"
    ) in out
    assert out.count("(3 size means of") == 2  # each variant's law, over the same 3 sizes


def test_a_compute_margin_is_stated_per_size_each_converted_at_its_own_slope(tmp_path, capsys):
    sweep = ladder_sweep(tmp_path / "sweep", [1.0] * 4, seeds=2, drops=[1.0, 2.0, 3.0, 4.0])
    assert main([str(sweep), "--margin-compute", "0.05"]) == 0
    out = capsys.readouterr().out
    lad = build_ladder(sweep, margin_compute=0.05)
    margins = {s["shape"]: s["report"].margin for s in lad.sizes}
    for s in lad.sizes:  # each size's own baseline slope converts the fraction
        assert s["report"].margin == pytest.approx(margin_from_compute(0.05, s["report"].slope))
    assert len({f"{m:.4g}" for m in margins.values()}) == 4  # four margins, not one
    md = (sweep / "report" / "report.md").read_text()
    assert (
        "- Margin: per size: ±0.05 of effective compute (`--margin-compute`), converted to nats "
        "at each size's own baseline slope, so no one margin in nats holds for every size"
    ) in md
    assert "at each size;" not in md and "at each size" not in out
    sizes = md.split("## Sizes")[1].split("\n## ")[0]
    assert "| margin (nats/token) | baseline slope (nats/e-fold) |" in sizes
    for s in lad.sizes:
        shape, rep = s["shape"], s["report"]
        row = next(line for line in sizes.splitlines() if line.startswith(f"| {shape} |"))
        assert f"| ±{rep.margin:.4g} | {rep.slope:.3g} (within-run) |" in row
        assert (
            f"  {shape}: margin ±{rep.margin:.4g} nats/token = 0.05 of effective compute at its "
            f"baseline's within-run slope {rep.slope:.3g} nats per e-fold of steps\n"
        ) in out


def test_a_ladder_refuses_the_options_of_one_comparison_and_plan(tmp_path, capsys):
    sweep = ladder_sweep(tmp_path / "sweep", [1.0] * 4, seeds=2)
    assert main([str(sweep), "--wandb"]) == 2
    assert "--wandb: these runs are a ladder" in capsys.readouterr().err
    assert main([str(sweep), "--plan", "0.01"]) == 1
    assert "plan on one size's run dirs" in capsys.readouterr().err
    assert not (sweep / "report").exists()
