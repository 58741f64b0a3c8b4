"""normlab's C++ CPU kernels (``norm.impl=cpp``): what the oracle grid in test_norms_oracle.py
does not pin down: eager-exact rounding in bf16/fp16, per-thread weight-gradient partials, row
counts that are not a multiple of the backward's 8-row blocks, ``torch.compile`` of a model that
uses them, rows of millions of elements, and one-line errors when the kernels cannot be built."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import normlab.norms as norms
from normlab.config import ConfigError, NormConfig, NormImpl, NormKind
from normlab.config.norm_table import KINDS
from normlab.norms import build_norm, cpp_impl, resolve_norm
from normlab.norms.reference import layer_norm_ref, rms_norm_ref

CPP_KINDS = [k for k, spec in KINDS.items() if NormImpl.cpp in spec.impls]  # the norm table's


def make(kind: NormKind, d: int, seed: int = 0) -> torch.nn.Module:
    norm = build_norm(resolve_norm(NormConfig(kind=kind, impl=NormImpl.cpp), "cpu"), d)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(d, generator=g))
        if norm.bias is not None:
            norm.bias.copy_(torch.randn(d, generator=g))
    return norm


def reference(norm, x):
    if norm.bias is not None or isinstance(norm, cpp_impl.CppLayerNorm):
        return layer_norm_ref(x, norm.weight, norm.bias, norm.eps)
    return rms_norm_ref(x, norm.weight, norm.eps)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("d", [768, 1000])
@pytest.mark.parametrize("kind", CPP_KINDS, ids=lambda k: k.name)
def test_low_precision_output_rounds_like_the_eager_reference(kind, d, dtype):
    """Same roundings as eager PyTorch: x_hat to the input dtype, times the weight rounded to the
    input dtype, rounded, plus the bias, rounded (d=1000 also runs the scalar tail columns). The
    fp32 statistics are summed in another order, so an x_hat at a rounding tie may land one unit of
    the dtype away (measured: at most 4 elements in 49152); a skipped or extra rounding step changes
    thousands."""
    norm = make(kind, d)
    x = (3 * torch.randn(64, d, generator=torch.Generator().manual_seed(1)) + 0.5).to(dtype)
    with torch.no_grad():
        got, want = norm(x), reference(norm, x)
    assert got.dtype == dtype
    differ = got != want
    assert differ.float().mean().item() <= 1e-3, (
        f"{differ.sum().item()} of {got.numel()} elements differ"
    )
    # an x_hat one unit off, times a weight up to 2: two units of the largest value in play
    scale = want.float().abs() + (0 if norm.bias is None else norm.bias.detach().abs())
    ulp = torch.finfo(dtype).eps * scale.clamp_min(torch.finfo(dtype).tiny)
    assert ((got.float() - want.float()).abs() <= 2 * ulp).all()


@pytest.mark.parametrize("rows", [1, 7, 8, 9, 1003])
@pytest.mark.parametrize("kind", CPP_KINDS, ids=lambda k: k.name)
def test_gradients_with_two_threads_match_float64_for_any_row_count(kind, rows):
    """Row blocks of 8 plus leftover rows, weight / bias gradients summed over per-thread
    partials."""
    norm = make(kind, 40)
    x = torch.randn(rows, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    dy = torch.randn(rows, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        xf = x.float().requires_grad_()
        got = torch.autograd.grad(norm(xf), (xf, *norm.parameters()), dy.float())
    finally:
        torch.set_num_threads(threads)
    x64 = x.clone().requires_grad_()
    params64 = [p.detach().double().requires_grad_() for p in norm.parameters()]
    if kind == NormKind.layer:
        y64 = layer_norm_ref(x64, params64[0], params64[1], norm.eps)
    else:
        y64 = rms_norm_ref(x64, params64[0], norm.eps)
    want = torch.autograd.grad(y64, (x64, *params64), dy)
    for name, g, w in zip(["dx", "dweight", "dbias"], got, want, strict=False):
        torch.testing.assert_close(
            g.double(), w, rtol=1e-5, atol=1e-5 * max(1.0, w.abs().max().item()), msg=name
        )


@pytest.mark.parametrize("kind", CPP_KINDS, ids=lambda k: k.name)
def test_compiled_model_with_cpp_norms_matches_eager(kind):
    """The ops have fake implementations, so ``torch.compile(fullgraph=True)`` traces through
    them."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), make(kind, 32), torch.nn.Linear(32, 4))
    x = torch.randn(3, 5, 32)
    y_eager = model(x)
    g_eager = torch.autograd.grad(y_eager.square().sum(), list(model.parameters()))
    y_comp = torch.compile(model, fullgraph=True)(x)
    g_comp = torch.autograd.grad(y_comp.square().sum(), list(model.parameters()))
    torch.testing.assert_close(y_comp, y_eager)
    for a, b in zip(g_comp, g_eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_kernel_that_does_not_compile_is_a_one_line_config_error(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    src = tmp_path / "broken.cpp"
    src.write_text("#include <torch/library.h>\nthis is not C++;\n")
    with pytest.raises(ConfigError) as e:
        cpp_impl.build("normlab_test_broken", src, [])
    assert "normlab: building the C++ norm kernels" in caplog.text  # the pause is announced
    assert "norm.impl=cpp could not build its C++ kernels" in str(e.value)
    assert "choose norm.impl=torch" in str(e.value) and "\n" not in str(e.value)


_TINY_CPP = 'extern "C" int normlab_test_answer() { return 42; }\n'


def _build_in_subprocess(ext_dir, name, src, env_extra=(), timeout=180):
    """Run :func:`cpp_impl.build` in a child (a hang fails the test instead of blocking it)."""
    code = (
        "import logging, sys; from pathlib import Path\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from normlab.norms import cpp_impl\n"
        "from normlab.config import ConfigError\n"
        f"try: cpp_impl.build({name!r}, Path({str(src)!r}), [])\n"
        "except ConfigError as e: print('ConfigError:', e); sys.exit(2)\n"
    )
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext_dir), **dict(env_extra)}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout
    )


def _build_dir(ext_dir, name) -> Path:
    """The folder torch builds extension ``name`` in under ``TORCH_EXTENSIONS_DIR=ext_dir``."""
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from torch.utils import cpp_extension as c; "
            "print(c._get_build_directory(sys.argv[1], False))",
            name,
        ],
        env={**os.environ, "TORCH_EXTENSIONS_DIR": str(ext_dir)},
        capture_output=True,
        text=True,
        check=True,
    )
    path = Path(probe.stdout.strip())
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_a_stale_build_lock_left_by_a_killed_build_is_cleared_not_waited_on(tmp_path):
    # torch's FileBaton leaves <build dir>/lock when its process is killed mid-build; every later
    # build then waited on it forever. normlab's own flock makes the leftover provably stale.
    src = tmp_path / "answer.cpp"
    src.write_text(_TINY_CPP)
    build_dir = _build_dir(tmp_path / "ext", "normlab_test_stale")
    (build_dir / "lock").write_text("")
    r = _build_in_subprocess(tmp_path / "ext", "normlab_test_stale", src, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "removing a stale build lock" in r.stderr
    assert (build_dir / "normlab_test_stale.so").exists() and not (build_dir / "lock").exists()


def test_the_same_source_at_another_path_loads_the_built_kernels_without_rebuilding(tmp_path):
    # ninja's build file named the source by its path: a kit installed in a new folder (or another
    # checkout) rebuilt the kernels, and the next run from the first path rebuilt them again
    first, second = tmp_path / "a" / "answer.cpp", tmp_path / "b" / "answer.cpp"
    for src in (first, second):
        src.parent.mkdir()
        src.write_text(_TINY_CPP)
    r = _build_in_subprocess(tmp_path / "ext", "normlab_test_moved", first)
    assert r.returncode == 0 and "building the C++ norm kernels" in r.stderr, r.stderr
    built = _build_dir(tmp_path / "ext", "normlab_test_moved") / "normlab_test_moved.so"
    stamp = built.stat().st_mtime_ns
    for src in (second, first):
        r = _build_in_subprocess(tmp_path / "ext", "normlab_test_moved", src)
        assert r.returncode == 0 and "building" not in r.stderr, r.stderr
        assert built.stat().st_mtime_ns == stamp


def test_a_live_builder_is_waited_for_with_a_notice_and_a_bounded_wait(tmp_path):
    src = tmp_path / "answer.cpp"
    src.write_text(_TINY_CPP)
    ext = tmp_path / "ext"
    build_dir = _build_dir(ext, "normlab_test_live")
    holder = subprocess.Popen(  # a live process holding the build lock
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; f = open(sys.argv[1], 'a+'); "
            "fcntl.flock(f, fcntl.LOCK_EX); f.write(str(os.getpid())); f.flush(); "
            "print('held', flush=True); time.sleep(60)",
            str(build_dir / "normlab.lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        r = _build_in_subprocess(
            ext, "normlab_test_live", src, env_extra={"NORMLAB_BUILD_WAIT_S": "1"}, timeout=60
        )
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"waiting (up to 1 s) for process {holder.pid}" in r.stderr
    assert f"process {holder.pid} has held the kernel build lock" in r.stdout
    # once the holder is gone (its flock died with it), the same build goes through
    r = _build_in_subprocess(ext, "normlab_test_live", src, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def _build_processes(src: Path, build_dir: Path) -> list[str]:
    """Live ninja and compiler processes of one build: those working in ``build_dir`` (ninja) or
    compiling ``src`` (the compiler driver and cc1plus), Python processes aside."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        exe = Path(args[0].decode(errors="replace")).name
        if "python" in exe:
            continue
        if cwd == str(build_dir) or str(src).encode() in b" ".join(args):
            found.append(f"{proc.name} {exe}")
    return found


def test_sigterm_during_a_build_ends_the_compiler_and_leaves_no_lock(tmp_path):
    # A SIGTERM (timeout, kill, SLURM) in the middle of a build used to orphan ninja and the
    # compiler, which went on writing into the build folder, and to leave torch's lock behind.
    src = tmp_path / "slow.cpp"
    src.write_text("#include <torch/extension.h>\nint normlab_slow() { return 1; }\n")
    ext = tmp_path / "ext"
    build_dir = _build_dir(ext, "normlab_test_term")
    code = (
        "import os; from pathlib import Path; from normlab.norms import cpp_impl\n"
        "cpp_impl.build('normlab_test_term', Path(os.environ['SRC']), [])\n"
    )
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext), "SRC": str(src)}
    child = subprocess.Popen([sys.executable, "-c", code], env=env)
    deadline = time.monotonic() + 120
    while not _build_processes(src, build_dir) and time.monotonic() < deadline:
        time.sleep(0.05)  # until ninja or the compiler runs
    assert _build_processes(src, build_dir), "the build never started"
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=60) == -signal.SIGTERM  # ended as SIGTERM ends a process
    time.sleep(1.0)
    assert not _build_processes(src, build_dir), "a compiler outlived the run"
    assert not (build_dir / "lock").exists()


def test_missing_ninja_is_a_config_error_naming_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(cpp_impl.shutil, "which", lambda name: None)
    monkeypatch.setattr(cpp_impl, "_ninja_module", lambda: False)
    with pytest.raises(ConfigError, match="needs ninja.*pip install ninja"):
        cpp_impl.build("normlab_test_no_ninja", tmp_path / "x.cpp", [])


def test_the_isa_pick_is_kept_per_cpu_and_torch_and_read_back_without_picking(
    tmp_path, monkeypatch
):
    picks = []
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(cpp_impl, "_pick_isa", lambda: picks.append(1) or ("isa_a", ["-mfoo"]))
    monkeypatch.setattr(cpp_impl, "_cpu_identity", lambda: "cpu one")
    assert cpp_impl._isa_flags() == ("isa_a", ["-mfoo"]) == cpp_impl._isa_flags()
    assert len(picks) == 1 and len(list(tmp_path.glob("normlab_isa_*.json"))) == 1

    monkeypatch.setattr(cpp_impl, "_cpu_identity", lambda: "cpu two")  # another CPU: its own pick
    assert cpp_impl._isa_flags() == ("isa_a", ["-mfoo"]) and len(picks) == 2
    for f in tmp_path.glob("normlab_isa_*.json"):
        f.write_text("{truncated")  # an unreadable file is picked anew and rewritten
    assert cpp_impl._isa_flags() == ("isa_a", ["-mfoo"]) and len(picks) == 3
    assert cpp_impl._isa_flags() == ("isa_a", ["-mfoo"]) and len(picks) == 3


def test_ops_refuse_a_weight_in_the_wrong_dtype():
    ops = cpp_impl.ops()
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="weight must be a contiguous"):
        ops.norm_fwd(x, torch.ones(16, dtype=torch.bfloat16), None, 1e-5, True)  # must be fp32


def test_non_cpu_input_is_refused_with_the_device_named():
    norm = make(NormKind.rms, 8)
    with pytest.raises(ValueError, match="CPU tensors only, got meta"):
        norm(torch.empty(2, 8, device="meta"))


@pytest.mark.parametrize("kind", CPP_KINDS, ids=lambda k: k.name)
def test_a_row_of_4m_elements_is_as_accurate_as_torch(kind):
    """A (2, 4M) fp32 input with mean 3: the row sums were 64 lanes each adding 62500 terms
    (LayerNorm output 3.6e-6 off, 2e-5 at 9.4M); summed in 4096-element blocks added in double
    they are as accurate as PyTorch's (about 1e-7 relative here, 4e-7 allowed)."""
    d = 4_000_000
    g = torch.Generator().manual_seed(0)
    x = (1.5 * torch.randn(2, d, generator=g) + 3.0).requires_grad_()
    dy = torch.randn(2, d, generator=g)
    norm = build_norm(
        resolve_norm(NormConfig(kind=kind, impl=NormImpl.cpp, affine=False), "cpu"), d
    )
    y = norm(x)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    y64 = norms.oracle(kind)(x64, None, None, norm.eps)
    y64.backward(dy.double())
    for name, got, want in (("output", y, y64), ("dx", x.grad, x64.grad)):
        err = ((got.double() - want).abs().max() / want.abs().max()).item()
        assert err <= 4e-7, f"{name}: normwise relative error {err:.2e}"


@pytest.mark.parametrize("kind", CPP_KINDS, ids=lambda k: k.name)
def test_autograd_is_the_cpp_node_and_matches_the_reference_for_strided_input(kind):
    """The op's backward is the C++ node (no Python autograd.Function per call); a transposed
    (non-contiguous) input and a bf16 weight give the reference's gradients."""
    norm = make(kind, 24)
    x = torch.randn(24, 6, dtype=torch.float64).float().t().requires_grad_()  # (6, 24) strided
    y = norm(x)
    assert y.grad_fn.name() == "NormlabNormBackward" and y.is_contiguous()
    dy = torch.randn(6, 24)
    got = torch.autograd.grad(y, (x, *norm.parameters()), dy)
    want = torch.autograd.grad(reference(norm, x), (x, *norm.parameters()), dy)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    w16 = norm.weight.detach().bfloat16().requires_grad_()
    y16 = torch.ops.normlab_cpu.norm(x, w16, None, norm.eps, kind == NormKind.rms)
    (gw,) = torch.autograd.grad(y16, w16, dy)
    assert gw.dtype == torch.bfloat16  # cast to the parameter's dtype at the end


def test_inference_mode_and_no_grad_give_the_same_output_without_a_graph():
    norm = make(NormKind.layer, 32)
    x = torch.randn(5, 32)
    with torch.no_grad():
        a = norm(x)
    with torch.inference_mode():
        b = norm(x)  # below autograd: the op's CPU kernel, forward only
    assert a.grad_fn is None and torch.equal(a, b)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rms", [True, False], ids=["rms", "layer"])
def test_ops_pass_torch_library_opcheck_so_fakes_match_the_kernels(rms, threads):
    # Schema, autograd registration, fake (meta) outputs against the real ones (shapes, dtypes:
    # dbias is (0,) for RMSNorm), and AOT dispatch: what torch.compile relies on.
    ops = cpp_impl.ops()
    g = torch.Generator().manual_seed(0)
    x, dy = torch.randn(2, 20, 96, generator=g).unbind(0)
    w = torch.randn(96, generator=g)
    b = None if rms else torch.randn(96, generator=g)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _, mean, rstd = ops.norm_fwd(x, w, b, 1e-5, rms)
        leaf = [t.clone().requires_grad_() if t is not None else None for t in (x, w, b)]
        for op, args in [
            (ops.norm_fwd.default, (x, w, b, 1e-5, rms)),
            (ops.norm_bwd.default, (dy, x, w, mean, rstd, rms)),
            (ops.norm.default, (*leaf, 1e-5, rms)),
        ]:
            result = torch.library.opcheck(op, args)
            assert set(result.values()) == {"SUCCESS"}, (op, result)
    finally:
        torch.set_num_threads(before)
