"""No tensor made on the CPU meets a device tensor: preflight, the norm bench's case and
``build_run`` run on the ``meta`` device under :class:`OneDevice`, which fails on any op that mixes
devices as a GPU would (``device_guard``)."""

from __future__ import annotations

import pytest
import torch

from normlab.bench import norms as bench_norms
from normlab.config import ConfigError, NormConfig, NormImpl
from normlab.config.norm_table import KINDS
from normlab.norms import preflight as preflight_module
from normlab.norms import resolve_norm
from normlab.norms.preflight import preflight, preflight_model
from normlab.norms.torch_impl import TorchRMSNorm
from normlab.training import setup

from .device_guard import MixedDevices, OneDevice

META = torch.device("meta")


@pytest.fixture
def meta_errors(monkeypatch):
    """Meta tensors have shapes and no values: the comparison checks where both tensors are and
    reports no error."""

    def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
        assert got.device == ref.device == META
        return 0.0

    monkeypatch.setattr(preflight_module, "_rel_error", rel_error)


def test_the_guard_catches_a_cpu_tensor_added_into_a_device_parameter():
    p = torch.nn.Parameter(torch.ones(4, device=META))
    with OneDevice(), torch.no_grad(), pytest.raises(MixedDevices, match=r"\['cpu', 'meta'\]"):
        p.add_(torch.ones(4))


def _eager_impl(kind) -> NormImpl:
    """An eager implementation of ``kind`` (PyTorch's where the table has it, else the
    reference): one that runs on the meta device."""
    return NormImpl.torch if NormImpl.torch in KINDS[kind].impls else NormImpl.reference


@pytest.mark.parametrize("kind", list(KINDS), ids=lambda k: k.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_preflight_keeps_every_tensor_on_the_device(kind, dtype, meta_errors):
    cfg = resolve_norm(NormConfig(kind=kind, impl=_eager_impl(kind)), "cpu")
    with OneDevice():
        result = preflight(cfg, 32, META, dtype)
    assert result["max_error"] == 0.0


@pytest.mark.parametrize("kind", list(KINDS), ids=lambda k: k.name)
def test_bench_case_keeps_every_tensor_on_the_device(kind):
    x = torch.randn(8, 32).to(META).requires_grad_()
    dy = torch.randn(8, 32).to(META)
    with OneDevice():
        case = bench_norms._norm_case(kind, _eager_impl(kind), "fp32", x, dy, META, None)
        out = {key: call() for key, call in case.calls.items()}
    assert out["fwd"].device == META
    assert all(g.device == META for g in out["fwdbwd"])


def test_build_run_keeps_every_tensor_on_the_device(cfg_tiny, monkeypatch, meta_errors):
    monkeypatch.setattr(setup, "resolve_device", lambda _: META)
    monkeypatch.setattr(setup, "check_precision", lambda *_: None)  # autocast has no meta kernel
    cfg = cfg_tiny("norm=rms", "norm.impl=torch", "norm.qk=head")
    with OneDevice():
        run = setup.build_run(cfg)
        batch = run.sampler.train_batch(0)
    assert {p.device for p in run.model.parameters()} == {META}
    assert all(t.device == META for t in batch)
    positions = {c["position"].split()[0] for c in run.preflight["checks"]}
    assert positions == {"attn_in", "qk"}  # mlp_in and final: the same norm as attn_in


def test_preflight_model_checks_each_norm_in_the_dtype_it_receives(cfg_tiny):
    cfg = cfg_tiny("norm=rms", "norm.impl=torch", "norm.qk=head", "norm.placement=peri")
    norm = resolve_norm(cfg.norm, "cpu")
    result = preflight_model(norm, cfg.model, torch.device("cpu"), torch.bfloat16)
    checked = {(c["position"], c["dtype"], c["shape"][1]) for c in result["checks"]}
    d, head = cfg.model.d_model, cfg.model.d_model // cfg.model.n_head
    # the stream's norms (attn_in, mlp_in, final) in fp32, the branch outputs and q, k in bf16
    assert checked == {
        ("attn_in (block 0)", "fp32", d),
        ("attn_out (block 0)", "bf16", d),
        ("qk (block 0)", "bf16", head),
    }


class _WrongInBf16(TorchRMSNorm):
    """Right in fp32, 10% too large for bf16 input: a fault only the bf16 path shows."""

    def forward(self, x):
        y = super().forward(x)
        return y * 1.1 if x.dtype == torch.bfloat16 else y


def test_build_run_refuses_a_norm_wrong_only_in_the_dtype_the_qk_norm_receives(
    cfg_tiny, monkeypatch
):
    """Under bf16 autocast the QK norm gets bf16 input (q, k come from a matmul): the preflight
    checks it in bf16, so a norm that is wrong only there is refused before training."""
    build = preflight_module.build_norm

    def build_norm(cfg, d):
        norm = build(cfg, d)
        if cfg.impl == NormImpl.reference:
            return norm
        wrong = _WrongInBf16(d, cfg.resolved_eps)
        wrong.load_state_dict(norm.state_dict())
        return wrong

    monkeypatch.setattr(preflight_module, "build_norm", build_norm)
    cfg = cfg_tiny("norm=rms", "norm.impl=torch", "norm.qk=head", "precision=bf16")
    with pytest.raises(ConfigError, match=r"norm\.impl=torch disagrees .* for bf16"):
        setup.build_run(cfg)
    setup.build_run(cfg_tiny("norm=rms", "norm.impl=torch", "norm.qk=head"))  # fp32: passes
