"""``norms.preflight``: every CPU implementation agrees with the reference; a broken one is refused
with one line naming the implementation, the tensor, the error and the tolerance."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from normlab.config import ConfigError, NormConfig, NormImpl, NormKind
from normlab.config.norm_table import KINDS
from normlab.norms import available_impls, resolve_norm
from normlab.norms.preflight import TOLERANCES, preflight
from normlab.norms.reference import NormBase
from normlab.norms.torch_impl import TorchLayerNorm, TorchRMSNorm

CPU = torch.device("cpu")
D = 96


def cfg(kind: NormKind, impl: NormImpl, **kw) -> NormConfig:
    return resolve_norm(NormConfig(kind=kind, impl=impl, **kw), "cpu")


class OffByOnePercentRMSNorm(TorchRMSNorm):
    """Forward 1% too large."""

    def forward(self, x):
        return super().forward(x) * 1.01


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w):
        return w.clone()

    @staticmethod
    def backward(ctx, g):
        return g * 1.03


class WrongDweightLayerNorm(TorchLayerNorm):
    """Right output, dweight 3% too large."""

    def forward(self, x):
        return torch.nn.functional.layer_norm(
            x, (self.d,), _ScaleGrad.apply(self.weight), self.bias, self.eps
        )


@pytest.mark.parametrize(
    ("kind", "impl"),
    [
        pytest.param(kind, NormImpl[name], id=f"{kind.name}-{name}")
        for kind in KINDS
        for name in available_impls("cpu", kind)
    ],
)
def test_cpu_implementations_pass_in_fp32(impl, kind):
    result = preflight(cfg(kind, impl), D, CPU, torch.float32)
    want = {"output", "dx", "dweight"} | ({"dbias"} if KINDS[kind].bias else set())
    want |= {f"d{name}" for name in KINDS[kind].extra_params}  # DyT: dalpha
    assert set(result["errors"]) == want
    assert result["impl"] == impl.name and result["kind"] == kind.name and result["dtype"] == "fp32"
    assert result["shape"] == [64, D] and result["tolerance"] == TOLERANCES[torch.float32] == 1e-5
    assert 0 <= result["max_error"] == max(result["errors"].values()) <= 1e-5
    if impl == NormImpl.reference:
        assert result["max_error"] == 0.0  # the reference against itself


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(
    "kind", [k for k, s in KINDS.items() if NormImpl.torch in s.impls], ids=lambda k: k.name
)
def test_torch_passes_in_low_precision(kind, dtype):
    with (
        warnings.catch_warnings()
    ):  # F.rms_norm: "Mismatch dtype between input and weight" (fp32 params)
        warnings.simplefilter("ignore", UserWarning)
        result = preflight(cfg(kind, NormImpl.torch), D, CPU, dtype)
    assert result["max_error"] <= TOLERANCES[dtype]
    assert result["max_error"] > 0  # really compared: rounding differs from the reference's


def test_without_affine_only_output_and_dx_are_compared():
    result = preflight(cfg(NormKind.layer, NormImpl.torch, affine=False), D, CPU, torch.float32)
    assert set(result["errors"]) == {"output", "dx"}


def test_a_forward_off_by_one_percent_is_refused_with_one_line(monkeypatch):
    monkeypatch.setitem(
        KINDS[NormKind.rms].impls, NormImpl.torch, f"{__name__}:OffByOnePercentRMSNorm"
    )
    with pytest.raises(ConfigError) as err:
        preflight(cfg(NormKind.rms, NormImpl.torch), D, CPU, torch.float32)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("norm.impl=torch disagrees with the reference: max rel error 1.0e-02 in ")
    assert "> tolerance 1e-05 for fp32" in msg


def test_a_wrong_weight_gradient_is_named(monkeypatch):
    monkeypatch.setitem(
        KINDS[NormKind.layer].impls, NormImpl.torch, f"{__name__}:WrongDweightLayerNorm"
    )
    with pytest.raises(
        ConfigError,
        match=r"^norm\.impl=torch disagrees with the reference: max rel error 3\.0e-02 in dweight "
        r"> tolerance 1e-05 for fp32",
    ):
        preflight(cfg(NormKind.layer, NormImpl.torch), D, CPU, torch.float32)


def test_a_one_percent_error_is_caught_in_fp16_too(monkeypatch):
    monkeypatch.setitem(
        KINDS[NormKind.rms].impls, NormImpl.torch, f"{__name__}:OffByOnePercentRMSNorm"
    )
    with pytest.raises(ConfigError, match="for fp16"):
        preflight(cfg(NormKind.rms, NormImpl.torch), D, CPU, torch.float16)


def test_the_global_rng_is_left_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    preflight(cfg(NormKind.rms, NormImpl.reference), D, CPU, torch.float32)
    assert torch.equal(torch.get_rng_state(), before)


def test_an_unresolved_auto_impl_is_refused():
    with pytest.raises(ConfigError, match="norm.impl=auto"):
        preflight(NormConfig(kind=NormKind.rms, impl=NormImpl.auto), D, CPU, torch.float32)


def test_training_refuses_to_start_when_the_implementation_disagrees_with_the_reference(
    compose_cfg, tmp_path, monkeypatch
):
    from normlab.compose import to_train_config
    from normlab.training.loop import train
    from tests.conftest import TINY

    real_forward = TorchRMSNorm.forward
    monkeypatch.setattr(TorchRMSNorm, "forward", lambda self, x: real_forward(self, x) * 1.01)
    with pytest.raises(ConfigError, match="disagrees with the reference"):
        train(
            to_train_config(compose_cfg([*TINY, "norm=rms", "norm.impl=torch"])),
            tmp_path,
        )
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_run_records_its_preflight_errors(compose_cfg, tmp_path):
    from normlab.compose import to_train_config
    from normlab.training.loop import train
    from tests.conftest import TINY

    summary = train(
        to_train_config(compose_cfg([*TINY, "norm=rms", "norm.impl=torch", "max_steps=1"])),
        tmp_path,
    )
    assert summary["preflight"]["impl"] == "torch"
    assert summary["preflight"]["max_error"] < 1e-5


@pytest.mark.parametrize("placement", ["pre", "post", "peri", "reordered"])
def test_norm_input_dtypes_match_what_the_model_feeds_its_norms(cfg_tiny, placement):
    """The dtype rule preflight checks by is the model's own: a bf16-autocast forward of the tiny
    GPT on this CPU, each norm's input dtype recorded by a hook."""
    from normlab.model import GPT
    from normlab.norms.preflight import norm_input_dtypes

    cfg = cfg_tiny("norm=rms", "norm.impl=torch", "norm.qk=head", f"norm.placement={placement}")
    norm = resolve_norm(cfg.norm, "cpu")
    model = GPT(dataclasses.replace(cfg.model, vocab_size=64), norm)
    seen: dict[str, set] = {}
    for name, module in model.named_modules():
        if isinstance(module, NormBase):  # blocks.0.attn_in, blocks.0.attn.q_norm, final
            last = name.split(".")[-1]
            position = "qk" if last in ("q_norm", "k_norm") else last
            module.register_forward_pre_hook(
                lambda _, args, p=position: seen.setdefault(p, set()).add(args[0].dtype)
            )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.zeros(2, 8, dtype=torch.long))
    want = norm_input_dtypes(norm, torch.bfloat16)
    assert seen == {p: {dtype} for p, dtype in want.items()}
