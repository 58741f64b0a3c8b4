"""summary.json's ``kernels``: the implementation class and backend of each norm position, and the
backend detection (QuACK's F.rms_norm override detected by availability, exercised on CPU)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest
import torch

from normlab.compose import to_train_config
from normlab.norms import backends, resolve_norm
from normlab.norms.backends import kernel_backend, quack_rms_norm_available
from normlab.training.loop import train
from normlab.training.record import kernels_record
from normlab.training.setup import build_model

from ..conftest import TINY


def test_a_cpu_run_records_the_kernel_of_each_norm_position(compose_cfg, tmp_path):
    overrides = [*TINY, "max_steps=1", "norm=rms", "norm.qk=head"]
    summary = train(to_train_config(compose_cfg(overrides)), tmp_path)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    cpp = {"impl_class": "normlab.norms.cpp_impl.CppRMSNorm", "backend": "normlab_cpu"}
    expected = {pos: cpp for pos in ("attn_in", "qk_q", "qk_k", "mlp_in", "final")}
    assert summary["kernels"] == on_disk["kernels"] == expected


def _model(cfg_tiny, *overrides):
    cfg = cfg_tiny(*overrides)
    cfg = dataclasses.replace(
        cfg,
        norm=resolve_norm(cfg.norm, "cpu"),
        model=dataclasses.replace(cfg.model, vocab_size=256),
    )
    return build_model(cfg, "cpu")


CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "impl, compiled, backend",
    [
        ("cpp", False, "normlab_cpu"),
        ("cpp", True, "normlab_cpu"),  # a custom op: an extern call inside the compiled graph
        ("compiled", False, "inductor"),
        ("reference", False, "aten"),
        ("torch", False, "aten"),
        ("torch", True, "inductor"),
    ],
)
def test_the_backend_of_each_cpu_implementation(cfg_tiny, impl, compiled, backend):
    model = _model(cfg_tiny, "norm=layer", f"norm.impl={impl}")
    assert kernel_backend(model.blocks[0].attn_in, CPU, compiled) == backend


def test_the_triton_implementation_under_the_interpreter(cfg_tiny, monkeypatch):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    model = _model(cfg_tiny, "norm=rms", "norm.impl=triton")
    assert kernel_backend(model.blocks[0].attn_in, CPU, False) == "triton-interpreter"
    record = kernels_record(model, CPU, False)
    assert record["attn_in"]["impl_class"].startswith("normlab.norms.triton_impl.")


def test_a_block_schedule_adds_the_blocks_whose_kernel_differs(cfg_tiny):
    model = _model(cfg_tiny, "norm=rms", "norm.impl=cpp", "norm.blocks=1:rms@reference")
    record = kernels_record(model, CPU, False)
    assert record["attn_in"]["backend"] == "normlab_cpu"
    assert record["attn_in (block 1)"] == {
        "impl_class": "normlab.norms.reference.ReferenceRMSNorm",
        "backend": "aten",
    }


@pytest.fixture
def hopper_with_cutlass(monkeypatch):
    """A CPU made to look like an sm90 GPU with torch 2.10 and ``cutlass`` importable."""
    monkeypatch.setattr(torch, "__version__", "2.10.0+cu128")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: object() if n == "cutlass" else real(n, *a)
    )
    return torch.device("cuda")


def test_quack_is_detected_where_torch_cutlass_and_the_gpu_allow_it(hopper_with_cutlass):
    assert quack_rms_norm_available(hopper_with_cutlass)
    assert not quack_rms_norm_available(CPU)


@pytest.mark.parametrize(
    "patch",
    [
        ("__version__", "2.9.1"),
        ("capability", (8, 0)),
        ("cutlass", None),
    ],
)
def test_quack_is_not_detected_when_one_condition_fails(hopper_with_cutlass, monkeypatch, patch):
    what, value = patch
    if what == "__version__":
        monkeypatch.setattr(torch, "__version__", value)
    elif what == "capability":
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: value)
    else:
        monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None)
    assert not quack_rms_norm_available(hopper_with_cutlass)


def test_torch_rms_norm_on_such_a_gpu_is_quack_but_layer_norm_and_compiled_are_not(
    cfg_tiny, hopper_with_cutlass
):
    gpu = hopper_with_cutlass
    rms = _model(cfg_tiny, "norm=rms", "norm.impl=torch").blocks[0].attn_in
    layer = _model(cfg_tiny, "norm=layer", "norm.impl=torch").blocks[0].attn_in
    assert kernel_backend(rms, gpu, False) == "quack"
    assert kernel_backend(layer, gpu, False) == "aten"
    assert kernel_backend(rms, gpu, True) == "inductor"  # the override does not fire compiled
    assert backends.QUACK_MODULE == "cutlass"
