"""Block-by-block schedules (``norm.blocks``) and per-position overrides (``norm.positions``):
the grammar, what each norm becomes, the names that say it, the refusals, and that a trained
run is rebuilt (resume, ``normlab-sample``) with its schedule."""

from __future__ import annotations

import json

import pytest
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from normlab.compose import register_schema
from normlab.config import ConfigError, NormConfig, NormImpl, NormKind, Placement, QKNorm, to_plain
from normlab.config.schedule import ScheduleEntry, norm_tag, parse_blocks
from normlab.model import GPT
from normlab.norms import norm_class, resolve_norm
from normlab.report.runs import Run
from normlab.report.variants import choose_baseline, label_runs
from normlab.training.sample import load_run
from normlab.training.tracking import run_names

from ..conftest import run_cli

KINDS, IMPLS = ["layer", "rms"], ["torch", "reference", "cpp"]


def test_the_grammar_reads_ranges_kinds_and_impls_sorted_by_block():
    assert parse_blocks("3:layer@torch/0-2:rms", KINDS, IMPLS) == [
        ScheduleEntry(0, 2, "rms", None),
        ScheduleEntry(3, 3, "layer", "torch"),
    ]
    assert parse_blocks(None, KINDS, IMPLS) == parse_blocks(" ", KINDS, IMPLS) == []
    assert str(ScheduleEntry(4, 7, "rms", "cpp")) == "4-7:rms@cpp"


@pytest.mark.parametrize(
    "text,says",
    [
        ("0-2", "entry '0-2' is not N:kind"),
        ("0-2:rms,3:layer", "entry '0-2:rms,3:layer' is not N:kind"),
        ("a-b:rms", "is not N:kind"),
        ("3-1:rms", "range 3-1 ends before it starts"),
        ("0-2:rms/2:layer", "ranges 0-2:rms and 2:layer overlap"),
        ("0:batch", "unknown kind 'batch'; allowed: layer, rms"),
        ("0:rms@cuda", "unknown impl 'cuda'; allowed: torch, reference, cpp"),
    ],
)
def test_a_malformed_schedule_is_one_line_naming_it(text, says):
    with pytest.raises(ConfigError, match="norm.blocks=") as e:
        parse_blocks(text, KINDS, IMPLS)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_one_schedule_per_entry_of_a_hydra_sweep_list_unquoted():
    (override,) = OverridesParser.create().parse_overrides(
        ["norm.blocks=null,0:rms,0-1:rms,0-2:rms/3:layer@torch"]
    )
    assert list(override.sweep_iterator()) == [
        None,
        "0:rms",
        "0-1:rms",
        "0-2:rms/3:layer@torch",
    ]


def model(n_layer=3, **norm) -> GPT:
    from normlab.config import ModelConfig

    cfg = ModelConfig(name="t", n_layer=n_layer, n_head=2, d_model=16, context_length=8)
    cfg.vocab_size = 32
    norm.setdefault("impl", NormImpl.reference)
    return GPT(cfg, resolve_norm(NormConfig(**norm), "cpu"))


def kinds_of(m: GPT) -> dict[str, str]:
    return {name: type(mod).__name__ for name, _, mod in _norms(m)}


def _norms(m):
    from normlab.training.diagnostics import named_norms

    return named_norms(m)


def test_a_schedule_switches_every_norm_of_its_blocks_qk_too_and_nothing_else():
    layer, rms = (
        norm_class(k, NormImpl.reference).__name__ for k in (NormKind.layer, NormKind.rms)
    )
    got = kinds_of(model(blocks="1-2:rms", qk=QKNorm.head, embedding=True))
    assert got == {
        "embedding/norm": layer,
        "block0/attn_in": layer,
        "block0/qk_q": layer,
        "block0/qk_k": layer,
        "block0/mlp_in": layer,
        **{f"block{i}/{n}": rms for i in (1, 2) for n in ("attn_in", "qk_q", "qk_k", "mlp_in")},
        "final/norm": layer,
    }


def test_kind_at_impl_and_position_overrides_and_their_precedence():
    m = model(
        blocks="0:rms@torch",
        positions={"final": {"kind": "rms"}, "mlp_in": {"eps": 1e-3}, "attn_in": {"kind": "rms"}},
    )
    assert type(m.blocks[0].attn_in) is norm_class(NormKind.rms, NormImpl.torch)
    assert type(m.blocks[1].attn_in) is norm_class(NormKind.rms, NormImpl.reference)
    assert type(m.blocks[1].mlp_in) is norm_class(NormKind.layer, NormImpl.reference)
    assert m.blocks[1].mlp_in.eps == m.blocks[0].mlp_in.eps == 1e-3  # schedule keeps other keys
    assert type(m.final) is norm_class(NormKind.rms, NormImpl.reference)
    # the schedule is applied after the position override: it wins on kind
    m = model(n_layer=2, blocks="0:layer", positions={"attn_in": {"kind": "rms"}})
    assert type(m.blocks[0].attn_in) is norm_class(NormKind.layer, NormImpl.reference)


def test_a_switched_kind_gets_its_own_default_bias_from_the_raw_values():
    layer_base = NormConfig(kind=NormKind.layer, blocks="0:rms")
    assert layer_base.bias is True and layer_base.at("attn_in", 0).bias is False
    rms_base = NormConfig(kind=NormKind.rms, blocks="0:layer")
    assert rms_base.at("attn_in", 0).bias is True and rms_base.at("attn_in", 1).bias is False
    no_bias = NormConfig(kind=NormKind.layer, bias=False, blocks="0:layer@torch")
    assert no_bias.at("attn_in", 0).bias is False  # an explicit non-default bias is kept
    m = model(n_layer=2, blocks="1:rms")
    assert m.blocks[0].attn_in.bias is not None and m.blocks[1].attn_in.bias is None


def test_outputs_differ_for_a_schedule_and_for_each_position_override():
    idx = torch.randint(0, 32, (2, 8))

    def logits(**norm):
        torch.manual_seed(0)
        m = model(**norm)
        with torch.no_grad():  # biases away from 0: LayerNorm and RMSNorm then differ clearly
            for p in m.parameters():
                if p.ndim == 1:
                    p.add_(0.1)
        return m(idx)[0]

    base = logits()
    for norm in (
        {"blocks": "0:rms"},
        {"blocks": "2:rms"},
        {"positions": {"final": {"kind": "rms"}}},
        {"positions": {"mlp_in": {"eps": 0.5}}},
        {"qk": QKNorm.head, "positions": {"qk": {"kind": "rms"}}, "embedding": False},
    ):
        assert not torch.allclose(base, logits(**norm)), norm


@pytest.mark.parametrize(
    "norm,says",
    [
        ({"positions": {"bottom": {"kind": "rms"}}}, "norm.positions='bottom'"),
        ({"positions": {"final": {"colour": 1}}}, "norm.positions.final='colour'"),
        ({"positions": {"final": {"kind": "batch"}}}, "norm.positions.final.kind='batch'"),
        ({"positions": {"qk": {"kind": "rms"}}}, "has no qk norm"),
        ({"positions": {"embedding": {"kind": "rms"}}}, "has no embedding norm"),
        ({"placement": Placement.post, "positions": {"final": {"eps": 1e-6}}}, "no final norm"),
        ({"placement": Placement.reordered, "positions": {"attn_in": {"eps": 1.0}}}, "attn_in"),
        ({"kind": NormKind.rms, "positions": {"final": {"bias": True}}}, "has no bias"),
    ],
)
def test_a_bad_position_override_is_one_line_naming_it(norm, says):
    with pytest.raises(ConfigError) as e:
        NormConfig(**norm)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_block_indices_are_checked_against_n_layer_before_training(cfg_tiny):
    with pytest.raises(ConfigError, match=r"block 2 is out of range for model.n_layer=2 \(blocks"):
        cfg_tiny("norm.blocks=0-2:rms")
    cfg_tiny("norm.blocks=0-1:rms")  # TINY has 2 blocks


def test_names_say_the_design(cfg_tiny):
    cfg = cfg_tiny(
        "norm.blocks=0:rms/1:layer@torch",
        "norm.placement=peri",
        "norm.qk=head",
        "norm.embedding=true",
        "norm.positions.final.kind=rms",
        "norm.impl=reference",
    )
    tag = "layer[0:rms/1:layer@torch]-reference-peri-qkhead-emb-final:rms"
    assert norm_tag(to_plain(cfg.norm), impl=True) == tag
    assert run_names(cfg) == (f"tiny-{tag}-fp32", f"tiny-{tag}-fp32-seed0")
    register_schema()  # the sweep dir's resolver: no '/' in a directory name
    node = OmegaConf.create({"norm": to_plain(cfg.norm), "d": "${norm_tag:${norm}}"})
    assert node.d == tag.replace("/", "+")
    assert norm_tag({"kind": "rms", "placement": "pre"}) == "rms-pre"


def _run(design: dict, seed: int) -> Run:
    norm = {"kind": "layer", "impl": "cpp", "placement": "pre", "qk": "none", "blocks": None}
    norm |= design
    overrides = [f"norm.{k}={v}" for k, v in design.items()] + [f"seed={seed}"]
    config = {f"norm.{k}": v for k, v in norm.items()} | {"seed": seed}
    return Run(path=None, overrides=overrides, config=config, metrics=[], summary=None)


def test_report_labels_a_design_sweep_by_its_tags_and_takes_pre_layernorm_as_baseline():
    runs = [
        _run({"kind": k, "placement": p, "qk": q}, s)
        for k in ("layer", "rms")
        for p in ("pre", "peri")
        for q in ("none", "head")
        for s in (0, 1)
    ]
    label_runs(runs)
    assert sorted({r.label for r in runs})[:3] == ["layer-peri", "layer-peri-qkhead", "layer-pre"]
    assert {r.label for r in runs} >= {"rms-pre-qkhead", "rms-peri"}
    assert choose_baseline(runs) == "layer-pre"
    sched = [_run({"blocks": b}, 0) for b in (None, "0:rms", "0-1:rms")]
    label_runs(sched)
    assert [r.label for r in sched] == ["layer-pre", "layer[0:rms]-pre", "layer[0-1:rms]-pre"]


@pytest.mark.slow  # three train subprocesses
def test_bad_schedules_stop_train_with_one_line_and_exit_2(tmp_path):
    for override, says in (
        ("norm.blocks=0-1:rms/1:rms", "overlap"),
        ("norm.blocks=0-12:rms", "out of range for model.n_layer=12"),
        ("norm.positions.bottom.kind=rms", "norm.positions.bottom.kind"),
    ):
        res = run_cli([override, "device=cpu"], tmp_path, timeout=120)
        err = res.stderr.strip()
        assert res.returncode == 2 and len(err.splitlines()) == 1 and says in err, err


@pytest.mark.slow  # two short trainings
def test_resume_and_sample_rebuild_the_model_with_its_placement_qk_and_schedule(
    cfg_tiny, tmp_path, one_thread
):
    from normlab.config import RunOptions
    from normlab.training.loop import train

    design = [
        "norm.placement=peri",
        "norm.qk=full",
        "norm.embedding=true",
        "norm.blocks=1:rms",
        "norm.positions.final.kind=rms",
        "norm.impl=reference",
        "logger=none",
    ]
    cfg = cfg_tiny(*design, "max_steps=2")
    train(cfg, tmp_path, RunOptions(ckpt_interval=1))
    longer = cfg_tiny(*design, "max_steps=4")
    summary = train(longer, tmp_path, RunOptions(resume="auto", force=True))
    assert summary["status"] == "completed" and summary["resumed"]["from_step"] == 2
    run = load_run(tmp_path, "cpu")
    m = run.model
    rms, layer = (norm_class(k, NormImpl.reference) for k in (NormKind.rms, NormKind.layer))
    assert run.norm.placement == Placement.peri and run.norm.qk == QKNorm.full
    assert type(m.blocks[1].attn_out) is rms and type(m.blocks[1].attn.q_norm) is rms
    assert type(m.blocks[0].attn_out) is layer and type(m.final) is rms
    assert m.embedding is not None and m.blocks[0].attn.q_norm.weight.shape == (m.cfg.d_model,)
    saved = json.loads((tmp_path / "summary.json").read_text())["config"]["norm"]
    assert saved["blocks"] == "1:rms" and saved["positions"]["final"]["kind"] == "rms"


#: A value other than the default for every NormConfig field (a new field must be given one here,
#: so that whether the design tag shows it is decided, and TAG_KEYS follows).
_OTHER_VALUE = {
    "kind": "rms",
    "impl": "cpp",
    "eps": 1e-6,
    "placement": "peri",
    "affine": False,
    "bias": False,
    "upcast": False,
    "alpha_init": 0.8,
    "gate_rank": 32,
    "zero_centered": True,
    "cast": "after_weight",
    "qk": "head",
    "embedding": True,
    "depth_scale": True,
    "mix_ln": 0.25,
    "blocks": "0:rms",
    "positions": {"final": {"kind": "rms"}},
}


def test_tag_keys_are_exactly_the_norm_keys_that_change_the_design_tag():
    from normlab.config.schedule import TAG_KEYS

    base = to_plain(NormConfig())
    assert set(_OTHER_VALUE) == set(base), "give every NormConfig field a value in _OTHER_VALUE"
    for key, value in _OTHER_VALUE.items():
        changed = norm_tag({**base, key: value}, impl=True) != norm_tag(base, impl=True)
        assert changed == (key in TAG_KEYS), key


def test_a_swept_key_the_design_tag_shows_is_not_repeated_in_the_run_label(cfg_tiny):
    from normlab.training.tracking import variant_label

    cfg = cfg_tiny("norm=rms", "norm.impl=reference", "norm.depth_scale=true")
    assert variant_label(cfg, ("norm.depth_scale=true",)) == "rms-reference-pre-ds-fp32 seed=0"
    cfg = cfg_tiny("norm=rms", "norm.impl=reference", "norm.mix_ln=0.5")
    assert variant_label(cfg, ("norm.mix_ln=0.5",)) == "rms-reference-mixln0.5-fp32 seed=0"
