"""The report on recorded kernels and norm weight decay: a speed ratio between runs whose norm
backends differ is not called a same-design ratio; the context names the norm gains' decay."""

from __future__ import annotations

import json
from pathlib import Path

from normlab.commands.report import main

from .test_report import LAYER, RMS, make_sweep, write_run


def _set_kernels(sweep: Path, norm: str, kernels: dict) -> None:
    for path in sweep.glob(f"{norm}-seed*/summary.json"):
        s = json.loads(path.read_text())
        s["kernels"] = kernels
        path.write_text(json.dumps(s))


def _kernels(backend: str, cls: str = "torch.nn.modules.normalization.RMSNorm") -> dict:
    k = {"impl_class": cls, "backend": backend}
    return {"attn_in": k, "mlp_in": k, "final": {**k, "backend": "aten"}}


def _report(sweep: Path) -> str:
    assert main([str(sweep), "--margin", "0.05"]) == 0
    return (sweep / "report" / "report.md").read_text()


def test_a_speed_ratio_across_other_backends_is_called_not_the_same_design(tmp_path):
    sweep = make_sweep(tmp_path / "sweep")
    _set_kernels(sweep, "layer", _kernels("aten", "torch.nn.modules.normalization.LayerNorm"))
    _set_kernels(sweep, "rms", _kernels("quack"))
    md = _report(sweep)
    line = (
        "`norm=rms` vs `norm=layer`: not the same design: backends differ: attn_in `aten` vs "
        "`quack`; mlp_in `aten` vs `quack` (the ratio times different kernels, not the norms' "
        "design alone)."
    )
    assert line in md
    # in the step-time ratio section, after its table
    assert md.index("## Step-time ratio") < md.index(line)


def test_the_same_backends_or_none_recorded_give_no_such_line(tmp_path):
    sweep = make_sweep(tmp_path / "sweep")
    assert "not the same design" not in _report(sweep)  # runs before the key: no claim
    sweep2 = make_sweep(tmp_path / "sweep2")
    _set_kernels(sweep2, "layer", _kernels("normlab_cpu", "normlab.norms.cpp_impl.CppLayerNorm"))
    _set_kernels(sweep2, "rms", _kernels("normlab_cpu", "normlab.norms.cpp_impl.CppRMSNorm"))
    assert "not the same design" not in _report(sweep2)


def test_the_context_names_the_norm_gains_weight_decay(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    edits = {"optim.weight_decay": 0.1, "optim.norm_weight_decay": "input_only"}
    for norm, losses in (("layer", LAYER), ("rms", RMS)):
        for seed, loss in losses.items():
            write_run(sweep, norm, seed, loss, edits=edits)
    assert "weight decay `0.1` (norm gains: `input_only`);" in _report(sweep)
    # runs written before the key decayed no norm gain
    assert "(norm gains: `none`);" in _report(make_sweep(tmp_path / "old"))
