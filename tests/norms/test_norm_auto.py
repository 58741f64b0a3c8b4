"""``norm.impl=auto``: the fastest implementation for the device that honours every option of the
model's norms, one ranking for every kind; an explicit ``norm.impl`` that cannot honour an option
is refused in one line; what auto chose is logged and in summary.json."""

from __future__ import annotations

import json

import pytest

from normlab import norms
from normlab.config import ConfigError, NormCast, NormConfig, NormImpl, NormKind
from normlab.model import GPT

from ..conftest import TINY, run_cli

OPTIONS = {
    "zero_centered": {"zero_centered": True},
    "after_weight": {"cast": NormCast.after_weight},
    "zero_centered+after_weight": {"zero_centered": True, "cast": NormCast.after_weight},
}


def test_auto_keeps_the_fused_cpu_kernels_where_no_option_rules_them_out():
    assert norms.resolve_norm(NormConfig(kind=NormKind.layer), "cpu").impl == NormImpl.cpp
    assert norms.resolve_norm(NormConfig(kind=NormKind.rms), "cpu").impl == NormImpl.cpp
    assert norms.resolve_norm(NormConfig(kind=NormKind.dyt), "cpu").impl == NormImpl.compiled


@pytest.mark.parametrize("kind", [NormKind.layer, NormKind.rms, NormKind.dyt], ids=str)
@pytest.mark.parametrize("option", OPTIONS, ids=str)
def test_auto_honours_zero_centred_weights_and_the_cast_order_for_every_kind(kind, option):
    """The C++ kernels compute neither: auto takes the next fastest, compiled, for every kind
    alike (was: refused, ``is not honoured by norm.impl=auto (-> cpp)``)."""
    cfg = norms.resolve_norm(NormConfig(kind=kind, **OPTIONS[option]), "cpu")
    assert cfg.impl == NormImpl.compiled
    assert norms.build_norm(cfg, 8).zero_centered == OPTIONS[option].get("zero_centered", False)


def test_what_auto_passed_over_and_why_is_logged(caplog):
    with caplog.at_level("INFO", logger="normlab.norms"):
        norms.resolve_norm(NormConfig(kind=NormKind.rms, zero_centered=True), "cpu")
    assert "norm.impl=auto -> compiled (passed over: cpp: zero_centered=true)" in caplog.text


def test_auto_with_upcast_false_is_the_one_implementation_that_computes_it():
    for kind in (NormKind.layer, NormKind.rms, NormKind.dyt):
        assert norms.resolve_norm(NormConfig(kind=kind, upcast=False), "cpu").impl == (
            NormImpl.reference
        )
    assert norms.resolve_norm(NormConfig(upcast=False), "cuda").impl == NormImpl.reference


def test_auto_on_cuda_prefers_triton_then_compiled_for_an_option_it_lacks(monkeypatch):
    monkeypatch.setattr(norms, "unavailable_reason", lambda impl, device: None)
    assert norms.resolve_norm(NormConfig(kind=NormKind.rms), "cuda").impl == NormImpl.triton
    cfg = NormConfig(kind=NormKind.rms, zero_centered=True, cast=NormCast.after_weight)
    assert norms.resolve_norm(cfg, "cuda").impl == NormImpl.triton  # triton computes both


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        (
            {"impl": NormImpl.cpp, "zero_centered": True},
            "norm.zero_centered=true is not honoured by norm.impl=cpp; "
            "only by: torch, reference, compiled, triton",
        ),
        (
            {"impl": NormImpl.cpp, "cast": NormCast.after_weight},
            "norm.cast=after_weight is not honoured by norm.impl=cpp; "
            "only by: torch, reference, compiled, triton",
        ),
        (
            {"impl": NormImpl.torch, "upcast": False},
            "norm.upcast=false is not honoured by norm.impl=torch; only by: reference",
        ),
        (
            {"impl": NormImpl.cpp, "positions": {"final": {"zero_centered": True}}},
            "norm.positions.final: norm.zero_centered=true is not honoured by norm.impl=cpp; "
            "only by: torch, reference, compiled, triton",
        ),
        (
            {"impl": NormImpl.cpp, "blocks": "1:dyt"},
            "norm.blocks='1:dyt' (block 1, attn_in): norm.impl=cpp has no norm.kind=dyt "
            "implementation; allowed here: torch, reference, compiled, auto",
        ),
    ],
    ids=["zero_centered", "cast", "upcast", "position", "schedule"],
)
def test_an_explicit_impl_that_cannot_honour_an_option_is_refused_in_one_line(
    fields, line, monkeypatch
):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # a CPU without Triton's interpreter
    with pytest.raises(ConfigError) as err:
        norms.resolve_norm(NormConfig(**fields), "cpu")
    assert str(err.value) == line


def test_one_implementation_for_every_norm_of_the_model_that_inherits_auto():
    """A DyT block in a LayerNorm model: cpp has no DyT, so auto takes compiled for the whole
    model (was: refused); a zero-centred final norm likewise; a position with its own impl keeps
    it and does not constrain auto."""
    cfg = norms.resolve_norm(NormConfig(blocks="1:dyt"), "cpu")
    assert cfg.impl == NormImpl.compiled and cfg.eps == 1e-5
    dyt = cfg.at("attn_in", 1)
    assert (dyt.kind, dyt.impl, dyt.eps) == (NormKind.dyt, NormImpl.compiled, None)
    final = {"final": {"zero_centered": True}}
    assert norms.resolve_norm(NormConfig(positions=final), "cpu").impl == NormImpl.compiled
    own = {"final": {"zero_centered": True, "impl": "reference"}}
    assert norms.resolve_norm(NormConfig(positions=own), "cpu").impl == NormImpl.cpp


def test_a_dyt_block_in_a_layernorm_model_builds_with_no_eps():
    from normlab.config import ModelConfig

    cfg = ModelConfig(name="t", n_layer=2, n_head=2, d_model=16, context_length=8, vocab_size=32)
    norm = norms.resolve_norm(NormConfig(impl=NormImpl.reference, blocks="1:dyt"), "cpu")
    model = GPT(cfg, norm)
    assert type(model.blocks[1].attn_in).__name__ == "ReferenceDyT"
    assert type(model.blocks[0].attn_in).__name__ == "ReferenceLayerNorm"


def test_train_with_a_zero_centred_rmsnorm_runs_with_auto_and_records_its_choice(tmp_path):
    run_dir = tmp_path / "run"
    args = [*TINY, "max_steps=2", "norm=rms", "norm.zero_centered=true", f"hydra.run.dir={run_dir}"]
    r = run_cli(args, tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["norm_impl"] == "compiled" and summary["norm"]["impl"] == "compiled"
    assert "norm rms/compiled" in (run_dir / "train.log").read_text()
