"""Per-block diagnostics against hand computation, and the fp16 overflow detector."""

from __future__ import annotations

import math

import pytest
import torch

from normlab.config import ModelConfig, NormConfig, NormImpl, NormKind
from normlab.model import GPT
from normlab.norms import resolve_norm
from normlab.training.diagnostics import (
    ActivationRecorder,
    block_grad_norms,
    first_nonfinite,
    gain_stats,
    norm_statistics_finite,
    sample_stride,
    tail_stats,
    zero_rows,
)


def two_layer(kind=NormKind.rms, impl=NormImpl.reference, upcast=True):
    torch.manual_seed(0)
    cfg = ModelConfig(name="t", n_layer=2, n_head=2, d_model=16, context_length=8, vocab_size=32)
    norm = resolve_norm(NormConfig(kind=kind, impl=impl, bias=False, upcast=upcast), "cpu")
    return GPT(cfg, norm)


def hand_rms(x: torch.Tensor) -> float:
    return math.sqrt(x.double().pow(2).mean().item())


def test_residual_rms_per_block_matches_hand_computation_on_a_fixed_input():
    model = two_layer()
    idx = torch.arange(16).view(2, 8) % 32
    rec = ActivationRecorder()
    with rec.hooks(model):
        model(idx)
    x0 = model.tok_emb(idx) + model.pos_emb(torch.arange(8))
    x1 = model.blocks[0](x0)
    x2 = model.blocks[1](x1)
    for i, x in enumerate((x0, x1)):
        assert math.isclose(rec.stats[f"diag/block{i}/resid_rms"], hand_rms(x), rel_tol=1e-6)
        assert math.isclose(
            rec.stats[f"diag/block{i}/resid_mean"],
            x.double().mean().item(),
            rel_tol=1e-5,
            abs_tol=1e-9,
        )
    assert math.isclose(rec.stats["diag/final/resid_rms"], hand_rms(x2), rel_tol=1e-6)
    # an RMSNorm with unit gain outputs rows of RMS 1 (up to eps)
    assert math.isclose(rec.stats["diag/block0/attn_in_out_rms"], 1.0, rel_tol=1e-2)
    logits = model.head(model.final(x2))
    assert math.isclose(rec.stats["diag/max_logit"], logits.abs().max().item(), rel_tol=1e-6)


def test_hooks_are_removed_after_the_diagnosed_pass():
    model = two_layer()
    with ActivationRecorder().hooks(model):
        pass
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_gain_statistics_and_block_gradient_norms():
    model = two_layer()
    with torch.no_grad():
        model.blocks[1].mlp_in.weight.copy_(torch.linspace(0.5, 2.0, 16))
    g = gain_stats(model)
    assert g["diag/block0/attn_in_gain_mean"] == 1.0
    assert (g["diag/block1/mlp_in_gain_min"], g["diag/block1/mlp_in_gain_max"]) == (0.5, 2.0)
    _, loss = model(torch.zeros(1, 8, dtype=torch.long), torch.ones(1, 8, dtype=torch.long))
    loss.backward()
    norms = block_grad_norms(model)
    expected = math.sqrt(
        sum(p.grad.double().pow(2).sum().item() for p in model.blocks[0].parameters())
    )
    assert math.isclose(norms["diag/block0/grad_norm"], expected, rel_tol=1e-6)


def test_fp16_detector_names_the_first_norm_whose_squares_overflow_without_fp32_statistics():
    model = two_layer(upcast=False).half()
    with torch.no_grad():
        model.tok_emb.weight.fill_(300.0)  # 300^2 = 90000 > 65504, the largest fp16
    found = first_nonfinite(model, torch.zeros(1, 8, dtype=torch.long))
    assert found is not None and found.module == "blocks.0.attn_in" and found.where == "statistics"
    assert "blocks.0.attn_in" in str(found)


def test_fp16_detector_finds_nothing_when_statistics_are_fp32():
    model = two_layer(upcast=True).half()
    with torch.no_grad():
        model.tok_emb.weight.fill_(300.0)
    assert first_nonfinite(model, torch.zeros(1, 8, dtype=torch.long)) is None


def test_fp16_detector_names_a_layer_that_makes_inf_from_finite_input():
    model = two_layer().half()
    with torch.no_grad():
        model.tok_emb.weight.fill_(1.0)
        model.pos_emb.weight.zero_()
        model.blocks[0].attn.proj.weight.zero_()  # the stream entering mlp_in stays all ones
        model.blocks[0].attn.proj.bias.zero_()
        model.blocks[0].mlp.fc.weight.fill_(
            5000.0
        )  # 16 x 5000 = 80000 > 65504: inf from finite input
    found = first_nonfinite(model, torch.zeros(1, 8, dtype=torch.long))
    assert found is not None and found.module == "blocks.0.mlp.fc" and found.input_finite


def _train_tiny(compose_cfg, tmp_path, *overrides):
    import json

    from normlab.compose import to_train_config
    from normlab.training.loop import train

    from ..conftest import TINY

    train(to_train_config(compose_cfg([*TINY, *overrides])), tmp_path)
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_diag_interval_logs_diag_keys_on_those_steps_only(compose_cfg, tmp_path):
    rows = _train_tiny(compose_cfg, tmp_path, "diag_interval=2", "norm=rms")
    assert [r["step"] for r in rows if "diag/block0/resid_rms" in r] == [2, 4, 6]
    row = next(r for r in rows if r["step"] == 2)
    for key in (
        "diag/block1/mlp_in_out_rms",
        "diag/block0/grad_norm",
        "diag/max_logit",
        "diag/block0/attn_in_gain_max",
        "diag/final/resid_rms",
    ):
        assert math.isfinite(row[key]), key


def test_without_diag_interval_no_hook_runs(compose_cfg, tmp_path, monkeypatch):
    calls = []
    real = ActivationRecorder.hooks
    monkeypatch.setattr(
        ActivationRecorder, "hooks", lambda self, model: calls.append(1) or real(self, model)
    )
    monkeypatch.setattr(torch.nn.Module, "register_forward_hook", lambda *a, **k: calls.append(2))
    monkeypatch.setattr(
        torch.nn.Module, "register_forward_pre_hook", lambda *a, **k: calls.append(3)
    )
    rows = _train_tiny(compose_cfg, tmp_path)
    assert calls == []
    assert not any(k.startswith("diag/") for r in rows for k in r)


def test_zero_rows_counts_rows_zeroed_from_a_non_zero_input_only():
    x = torch.tensor([[1.0, 2.0], [0.0, 0.0], [3.0, 0.0], [1.0, 1.0]])
    out = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.5, 0.0]])
    assert zero_rows(x, out) == 2  # rows 0 and 2; row 1 was zero already, row 3 is not all zero


def test_an_fp32_statistic_overflow_is_seen_though_the_output_is_finite_zeros():
    model = two_layer(NormKind.layer).eval()
    norm = model.blocks[0].attn_in
    x = torch.full((3, 8, model.cfg.d_model), 2e19)  # x^2 = 4e38 > fp32's 3.4e38
    x[..., ::2] *= -1  # mean 0, variance 4e38: inf in fp32
    out = norm(x)
    assert torch.isfinite(out).all() and (out == 0).all()  # no NaN: the silent failure
    assert zero_rows(x, out) == 24 and not norm_statistics_finite(norm, x)
    rec = ActivationRecorder()
    with rec.hooks(model), torch.no_grad():
        model.blocks[0](x)
    assert rec.stats["diag/block0/attn_in_zero_rows"] == 24


# --- every norm by its position name --------------------------------------------------------------


def designed(**norm):
    torch.manual_seed(0)
    cfg = ModelConfig(name="t", n_layer=2, n_head=2, d_model=16, context_length=8, vocab_size=32)
    return GPT(cfg, resolve_norm(NormConfig(impl=NormImpl.reference, **norm), "cpu"))


def test_diag_keys_name_every_norm_by_position_for_peri_qk_and_embedding():
    from normlab.config import Placement, QKNorm
    from normlab.training.diagnostics import named_norms

    model = designed(placement=Placement.peri, qk=QKNorm.head, embedding=True)
    names = [n for n, _, _ in named_norms(model)]
    per_block = ["attn_in", "qk_q", "qk_k", "attn_out", "mlp_in", "mlp_out"]
    assert names == [
        "embedding/norm",
        *[f"block{i}/{p}" for i in range(2) for p in per_block],
        "final/norm",
    ]
    modules = dict(model.named_modules())
    assert all(modules[q] is m for _, q, m in named_norms(model))  # qualified names are real
    rec = ActivationRecorder()
    with rec.hooks(model):
        model(torch.arange(16).view(2, 8) % 32)
    gains = gain_stats(model)
    for n in names:
        assert math.isfinite(rec.stats[f"diag/{n}_out_rms"]) and f"diag/{n}_zero_rows" in rec.stats
        assert gains[f"diag/{n}_gain_mean"] == 1.0
    assert "diag/final/resid_rms" in rec.stats


def test_post_norm_has_no_final_norm_but_the_stream_entering_the_head_is_recorded():
    from normlab.config import Placement

    model = designed(placement=Placement.post)
    rec = ActivationRecorder()
    with rec.hooks(model):
        model(torch.arange(16).view(2, 8) % 32)
    assert "diag/final/resid_rms" in rec.stats and "diag/final/norm_out_rms" not in rec.stats
    assert "diag/block1/mlp_out_out_rms" in rec.stats  # the last block ends in its norm
    assert math.isclose(rec.stats["diag/final/resid_rms"], 1.0, rel_tol=0.05)  # LayerNorm output


def test_norm_cost_counts_time_once_nested_norms_inside_attention_and_norm_wrappers(monkeypatch):
    """A fake clock advancing 1 ms per read: each slice between two hook events goes to the
    innermost open module, so the QK-norms' slices are norm time and not attention time too."""
    import itertools

    from normlab.config import QKNorm
    from normlab.studies import norm_cost

    model = designed(qk=QKNorm.head)
    model.blocks = model.blocks[:1]

    class Wrapper(torch.nn.Module):  # a norm wrapping another: both look like norms
        def __init__(self, inner):
            super().__init__()
            self.inner, self.eps, self.upcast, self.weight = inner, inner.eps, True, inner.weight

        def forward(self, x):
            return self.inner(x)

    model.final = Wrapper(model.final)
    clock = itertools.count(0.0, 1e-3)
    monkeypatch.setattr(norm_cost.time, "perf_counter", lambda: next(clock))
    timer = norm_cost.ModuleTimer(model, torch.device("cpu"))
    with timer.attached(), torch.no_grad():
        model(torch.zeros(1, 8, dtype=torch.long))
    # attn_in, q_norm, k_norm, mlp_in, final (the wrapper, not its inner norm): 5 norm calls
    assert timer.calls[("norm", "fwd")] == 5 and timer.calls[("attention", "fwd")] == 1
    # attention: [start, q start], [q stop, k start], [k stop, stop] = 3 slices; each norm 1
    assert timer.ms[("attention", "fwd")] == pytest.approx(3.0)
    assert timer.ms[("norm", "fwd")] == pytest.approx(5.0)
    assert timer.ms[("mlp", "fwd")] == pytest.approx(1.0)


# --- outliers: abs-max, p99 and kurtosis of the sublayers' outputs -------------------------------


def gaussian(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_kurtosis_of_a_gaussian_tensor_is_near_3():
    # 2^20 samples: the sample kurtosis has a standard error of sqrt(24 / n) ~ 0.005, so 0.05 is
    # ten standard errors: a wrong formula (excess kurtosis 0, sample variance, no centring) misses
    absmax, p99, kurt = tail_stats(gaussian(1024, 1024) * 3.0 + 1.0)
    assert kurt == pytest.approx(3.0, abs=0.05)
    # |x| of N(1, 9): P(|x| <= q) = 0.99 at q = 8.12 (solved: Phi((q-1)/3) - Phi((-q-1)/3) = 0.99);
    # the sample p99 of 2^20 values has a standard error of about 0.011
    assert p99 == pytest.approx(8.12, abs=0.1)
    assert absmax > p99


def test_kurtosis_of_heavy_tailed_tensors_is_far_above_3():
    student = torch.distributions.StudentT(5.0).sample((1 << 18,))  # kurtosis 9 in theory
    assert tail_stats(student)[2] > 5.0
    x = gaussian(1 << 16)
    x[:: 1 << 13] = 50.0  # 8 outliers of 50 sigma among 65536: kurtosis ~ 8 * 50^4 / 65536 ~ 760
    assert tail_stats(x)[2] > 300.0


def test_abs_max_is_exact_over_every_element_even_when_the_rest_is_subsampled():
    x = gaussian(4, 512, 768)  # 1.57M elements: p99 and kurtosis on a strided subsample
    x[1, 2, 3] = -123.456  # an element no stride of 2 or 3 would reach
    absmax, _, _ = tail_stats(x)
    assert absmax == x.abs().max().item() == pytest.approx(123.456)


def test_the_subsample_visits_every_feature_so_an_outlier_feature_is_seen():
    x = gaussian(4, 512, 768)
    x[..., 7] *= 30.0  # one outlier feature (an odd one: a stride of 2 would skip it entirely)
    stride = sample_stride(x.numel(), 768)
    assert stride > 1 and math.gcd(stride, 768) == 1
    full = tail_stats(x, size=x.numel())[2]
    assert full > 300.0  # about 670 in theory: (767 * 3 + 3 * 30^4) / 768 / ((767 + 900) / 768)^2
    # the subsample holds about 400 of the feature's 2048 values: the same order, not the same
    # digits; a stride of 2 would see none of them and give about 3
    assert 0.5 * full < tail_stats(x)[2] < 2 * full
    assert tail_stats(x.reshape(-1)[::2])[2] == pytest.approx(3.0, abs=0.1)


def test_sublayer_outputs_get_abs_max_p99_and_kurtosis_on_a_diagnosed_pass():
    model = two_layer()
    idx = torch.arange(16).view(2, 8) % 32
    rec = ActivationRecorder()
    with rec.hooks(model):
        model(idx)
    b0 = model.blocks[0]
    x0 = model.tok_emb(idx) + model.pos_emb(torch.arange(8))
    attn = b0.attn(b0.attn_in(x0))
    x1 = b0(x0)
    mlp = b0.mlp(b0.mlp_in(x0 + attn))
    for name, t in (("attn", attn), ("mlp", mlp), ("resid", x0)):
        stats = [rec.stats[f"diag/block0/{name}{s}"] for s in ("_absmax", "_p99", "_kurtosis")]
        assert stats == pytest.approx(list(tail_stats(t)), rel=1e-5), name
        assert stats[0] == pytest.approx(t.abs().max().item(), rel=1e-6)
    assert rec.stats["diag/block1/resid_absmax"] == pytest.approx(x1.abs().max().item(), rel=1e-6)
    for i in (0, 1):
        assert {f"diag/block{i}/{b}_kurtosis" for b in ("attn", "mlp", "resid")} <= set(rec.stats)
    assert "diag/final/resid_kurtosis" in rec.stats
