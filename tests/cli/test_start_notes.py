"""What a run says at its start when the machine makes it slow: bf16 on a CPU without native bf16
arithmetic is emulated, and one warning line names the CPU (``/proc/cpuinfo`` stood in for by a
file, so the test reads the same on every machine)."""

from __future__ import annotations

import logging

import pytest
import torch

from normlab.config import Precision
from normlab.training import precision

INTEL = "Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz"


def cpuinfo(tmp_path, flags: str, model: str = INTEL):
    core = f"processor\t: {{}}\nmodel name\t: {model}\nflags\t\t: {flags}\n\n"
    path = tmp_path / "cpuinfo"
    path.write_text(core.format(0) + core.format(1))  # one entry per core, as Linux writes it
    return path


def warnings_of(check, caplog) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=precision.__name__):
        check()
    return [r.getMessage() for r in caplog.records if r.name == precision.__name__]


def test_bf16_on_a_cpu_without_native_bf16_is_one_warning_naming_the_cpu(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(precision, "CPUINFO", cpuinfo(tmp_path, "fpu sse4_2 avx2 avx512f"))
    cpu = torch.device("cpu")
    (line,) = warnings_of(lambda: precision.check_precision(Precision.bf16, cpu), caplog)
    assert line == (
        f"normlab: precision=bf16 on {INTEL}: no native bf16 (no avx512_bf16 or amx_bf16 in "
        f"{precision.CPUINFO}), so bf16 is emulated, usually slower than fp32"
    )
    assert not warnings_of(lambda: precision.check_precision(Precision.fp32, cpu), caplog)
    assert not warnings_of(lambda: precision.check_precision(Precision.fp16, cpu), caplog)


@pytest.mark.parametrize(
    "flags", ["fpu avx512f avx512_bf16", "fpu amx_bf16 amx_tile", "fp asimd bf16"], ids=str
)
def test_bf16_on_a_cpu_with_native_bf16_says_nothing(tmp_path, monkeypatch, caplog, flags):
    monkeypatch.setattr(precision, "CPUINFO", cpuinfo(tmp_path, flags))
    check = lambda: precision.check_precision(Precision.bf16, torch.device("cpu"))  # noqa: E731
    assert not warnings_of(check, caplog)


def test_no_warning_where_the_flags_cannot_be_read(tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "CPUINFO", tmp_path / "absent")
    assert precision.emulated_bf16() is None
    (tmp_path / "absent").write_text("processor\t: 0\n")  # a cpuinfo without a flags line
    assert precision.emulated_bf16() is None
