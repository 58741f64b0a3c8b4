"""The Triton kernels (impl=triton) under the CPU interpreter, held to the same oracle checks.

Triton picks interpreter or compiler when a kernel is *decorated*: ``tests/conftest.py`` sets
``TRITON_INTERPRET=1`` for the whole session on a CPU, before anything imports torch or the kernel
module, so the kernels here are interpreted (a session on a GPU, ``NORMLAB_TEST_DEVICE=cuda``,
skips this file); each test sets it again (``resolve_norm`` reads it to allow triton on cpu).
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("the Triton interpreter tests need a CPU session", allow_module_level=True)

from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

import normlab.norms.triton_impl as tk  # noqa: E402
from normlab.config import ConfigError, NormConfig, NormImpl, NormKind  # noqa: E402
from normlab.norms import build_norm, norm_class, resolve_norm  # noqa: E402

from .test_norms_oracle import (  # noqa: E402
    DTYPES,
    HIDDEN,
    KIND_PARAM,
    LAYOUT_IDS,
    LAYOUTS,
    LEADING,
    assert_matches,
    check_bf16_dweight_sum,
    check_fp16_row_of_10,
    check_fp16_rows_of_300,
    check_layer_and_rms_agree_on_zero_mean_rows,
    check_matches_oracle,
    check_mean_square_is_variance_plus_squared_mean,
    check_zero_row,
    make_norm,
    oracle,
)

TRITON = NormImpl.triton
KINDS = KIND_PARAM


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_kernels_are_interpreted_and_registered():
    assert isinstance(tk._norm_fwd, InterpretedFunction) and isinstance(
        tk._norm_bwd, InterpretedFunction
    )
    assert norm_class(NormKind.layer, TRITON) is tk.TritonLayerNorm
    assert norm_class(NormKind.rms, TRITON) is tk.TritonRMSNorm


def test_triton_on_cpu_is_a_config_error_without_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ConfigError, match="norm.impl=triton"):
        resolve_norm(NormConfig(impl=TRITON), "cpu")


# ------------------------------------------------------------------- oracle comparisons


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead", LEADING, ids=str)
@pytest.mark.parametrize("d", HIDDEN)
@pytest.mark.parametrize(("kind", "bias"), LAYOUTS, ids=LAYOUT_IDS)
def test_output_and_gradients_match_float64_oracle(kind, bias, d, lead, dtype):
    check_matches_oracle(kind, TRITON, d, lead, dtype, bias)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("kind", "bias"), LAYOUTS, ids=LAYOUT_IDS)
def test_permuted_noncontiguous_input_matches_float64_oracle(kind, bias, dtype):
    check_matches_oracle(kind, TRITON, 1000, (2, 5), dtype, bias, permuted=True)


@pytest.mark.parametrize(("d", "lead"), [(4097, (21,)), (1000, (4, 3, 7)), (64, (1000,))], ids=str)
@pytest.mark.parametrize(("kind", "bias"), LAYOUTS, ids=LAYOUT_IDS)
def test_several_row_tiles_per_backward_program_match_float64_oracle(kind, bias, d, lead):
    # The backward runs 4 programs on CPU, each looping over row tiles: (21, 4097) is 21 one-row
    # tiles (6 per program; the 6th of programs 1-3 is past the end); (1000, 64) is 16 tiles of
    # 64 rows,
    # the last one partly masked.
    check_matches_oracle(kind, TRITON, d, lead, torch.float32, bias)


@KINDS
def test_affine_false_has_no_parameters_and_matches_oracle(kind):
    norm = make_norm(kind, TRITON, 1000, affine=False)
    assert not list(norm.parameters())
    x = torch.randn(2, 5, 1000, requires_grad=True)
    y = norm(x)
    y.sum().backward()  # dy = ones, expanded with stride 0
    x64 = x.detach().double().requires_grad_()
    y64 = oracle(kind, x64, None, None, norm.eps)
    y64.sum().backward()
    assert_matches(y, y64, torch.float32, "output")
    assert_matches(x.grad, x64.grad, torch.float32, "grad input")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("kind", "bias"), LAYOUTS, ids=LAYOUT_IDS)
def test_params_in_the_input_dtype_get_gradients_in_that_dtype(kind, bias, dtype):
    norm = make_norm(kind, TRITON, 1000, bias=bias).to(dtype)
    x = torch.randn(3, 1000, dtype=dtype, requires_grad=True)
    y = norm(x)
    y.backward(torch.randn_like(y))
    assert y.dtype == dtype and x.grad.dtype == dtype
    assert all(p.grad.dtype == dtype and torch.isfinite(p.grad).all() for p in norm.parameters())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("kind", "bias"), LAYOUTS, ids=LAYOUT_IDS)
def test_low_precision_forward_rounds_like_the_reference(kind, bias, dtype):
    """x_hat and w are rounded to the input dtype before the product, as in reference.py, so
    >= 99.5% of outputs are bit-identical (the rest: fp32 statistics summed in another order
    that round x_hat the other way). Rounding ``x_hat * w`` once instead matches only ~65%."""
    ours = make_norm(kind, TRITON, 1536, bias=bias)
    ref = make_norm(kind, NormImpl.reference, 1536, bias=bias)
    x = (2 * torch.randn(8, 1536, generator=torch.Generator().manual_seed(5)) + 0.5).to(dtype)
    y, y_ref = ours(x).float(), ref(x).float()
    assert (y == y_ref).float().mean() >= 0.995
    assert (y - y_ref).abs().max() <= 2 * torch.finfo(dtype).eps * y_ref.abs().max()


@KINDS
def test_empty_input_gives_empty_output_and_gradients(kind):
    norm = make_norm(kind, TRITON, 768)
    x = torch.randn(0, 768, requires_grad=True)
    y = norm(x)
    y.sum().backward()
    assert y.shape == (0, 768) and x.grad.shape == (0, 768)
    assert (norm.weight.grad == 0).all()


def test_wrong_hidden_size_and_rms_bias_are_value_errors():
    with pytest.raises(ValueError, match="768"):
        make_norm(NormKind.layer, TRITON, 768)(torch.randn(2, 769))
    with pytest.raises(ValueError, match="no bias"):
        tk.TritonRMSNorm(768, 1e-5, bias=True)


# --------------------------------------------------------------- known failure kinds


@KINDS
def test_fp16_rows_of_300_normalize_to_one_with_fp32_statistics(kind):
    check_fp16_rows_of_300(kind, TRITON)


@KINDS
def test_fp16_row_of_10_normalizes_to_one_with_fp32_accumulator(kind):
    check_fp16_row_of_10(kind, TRITON)


@pytest.mark.parametrize(("kind", "bias"), LAYOUTS, ids=LAYOUT_IDS)
def test_all_zero_row_gives_bias_or_zeros_with_finite_gradients(kind, bias):
    check_zero_row(kind, TRITON, bias)


@pytest.mark.parametrize("param_dtype", [torch.float32, torch.bfloat16], ids=str)
@KINDS
def test_bf16_dweight_of_2048_rows_sums_to_20_5_in_fp32(kind, param_dtype):
    check_bf16_dweight_sum(kind, TRITON, param_dtype)


# ------------------------------------------------------------------------- identities


def test_applied_mean_square_equals_variance_plus_squared_mean():
    check_mean_square_is_variance_plus_squared_mean(TRITON)


def test_layernorm_and_rmsnorm_agree_on_zero_mean_rows():
    check_layer_and_rms_agree_on_zero_mean_rows(TRITON)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_saved_statistics_are_fp32_per_row_and_satisfy_mean_square_identity(dtype):
    """The kernels' own saved statistics: mean and rstd (rows,) fp32; 1/rstd_rms^2 - eps
    (mean square) = 1/rstd_ln^2 - eps (variance) + mean^2."""
    x = (
        (torch.randn(2, 3, 1000) * 0.7 + torch.linspace(-2, 3, 3)[:, None])
        .to(dtype)
        .requires_grad_()
    )
    eps = 1e-5
    layer = build_norm(
        resolve_norm(NormConfig(kind=NormKind.layer, impl=TRITON, eps=eps), "cpu"), 1000
    )
    rms = build_norm(resolve_norm(NormConfig(kind=NormKind.rms, impl=TRITON, eps=eps), "cpu"), 1000)
    _, _, mean, rstd_ln = layer(x).grad_fn.saved_tensors  # (x2d, weight, mean, rstd)
    _, _, no_mean, rstd_rms = rms(x).grad_fn.saved_tensors
    assert no_mean is None
    assert mean.shape == rstd_ln.shape == rstd_rms.shape == (6,)
    assert mean.dtype == rstd_ln.dtype == rstd_rms.dtype == torch.float32
    x64 = x.detach().double().reshape(6, 1000)
    torch.testing.assert_close(mean.double(), x64.mean(-1), rtol=1e-5, atol=1e-5)
    mean_square, var = rstd_rms.double().pow(-2) - eps, rstd_ln.double().pow(-2) - eps
    torch.testing.assert_close(mean_square, var + mean.double() ** 2, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mean_square, (x64 * x64).mean(-1), rtol=1e-5, atol=1e-5)


#: fp32 bit patterns whose rounding is special: the GPU's canonical NaN (0x7FFFFFFF: its mantissa
#: plus the rounding bias overflows into the sign bit), a negative NaN, the interpreter's NaN, both
#: infinities, the largest fp32 (rounds to inf), 1 + 1 ulp (rounds to 1), a tie to even.
SPECIAL_BITS = [
    0x7FFFFFFF,
    0xFFFFFFFF,
    0x7FC00000,
    0x7F800000,
    0xFF800000,
    0x7F7FFFFF,
    0x3F800001,
    0x3F808000,
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_round_to_keeps_nan_and_inf_and_rounds_like_a_cast(dtype, monkeypatch):
    """``_round_to`` of each special fp32 bit pattern equals torch's cast to ``dtype`` (round to
    nearest even, NaN stays NaN, inf stays inf)."""
    import triton
    import triton.language as tl

    monkeypatch.setenv("TRITON_INTERPRET", "1")

    def round_kernel(X, Y, N, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        x = tl.load(X + i, mask=i < N)
        tl.store(Y + i, tk._round_to(x, DTYPE), mask=i < N)

    kernel = triton.jit(round_kernel)  # decorated under the interpreter
    signed = [b - (1 << 32) if b >= 1 << 31 else b for b in SPECIAL_BITS]
    x = torch.tensor(signed, dtype=torch.int32).view(torch.float32)
    y = torch.empty_like(x)
    tl_dtype = tl.bfloat16 if dtype == torch.bfloat16 else tl.float16
    kernel[(1,)](x, y, x.numel(), DTYPE=tl_dtype, BLOCK=triton.next_power_of_2(x.numel()))
    want = x.to(dtype).float()
    assert torch.equal(y.isnan(), want.isnan()), f"NaN lost: {y.tolist()} vs {want.tolist()}"
    assert torch.equal(y[~want.isnan()], want[~want.isnan()]), f"{y.tolist()} vs {want.tolist()}"
