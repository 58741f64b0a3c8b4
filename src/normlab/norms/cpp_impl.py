"""normlab's fused C++ LayerNorm and RMSNorm for CPU (``norm.impl=cpp``), forward and backward.

The kernels (``cpu_kernels.cpp``) are compiled on first use with ``torch.utils.cpp_extension``
(g++ and ninja; seconds, announced as a log warning), once per
machine and version of the kernel source (the build is named by a hash of the source and flags),
then loaded from ``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``). The vector ISA
is the one inductor picks for this CPU (AVX-512, plus AVX512-BF16 where present; AVX2 elsewhere).
The ops are registered as ``torch.ops.normlab_cpu``: ``norm(x, weight?, bias?, eps, rms) -> y``,
the one the modules call, has its autograd registered in C++ (a ``torch::autograd::Node``, at the
end of ``cpu_kernels.cpp``), so a call carries no Python ``autograd.Function`` (whose overhead
exceeds the kernel itself on short inputs); ``norm_fwd`` / ``norm_bwd`` are the kernels
it calls through the dispatcher (``torch.compile`` traces them with the fakes registered here).

Why they exist: on CPU, PyTorch's RMSNorm is not fused and inductor's code for the backward makes
a second pass over x and dy for the weight gradient (a column reduction), so neither measures what
RMSNorm itself costs. These kernels give both kinds the same treatment: the forward keeps a row in
L1 between the statistics and the output; the backward reads every tensor from memory once. Rows
of more than 4 KiB go in blocks of 8: one sweep over their columns accumulates in registers both
the per-row sums and the block's column sums for ``dweight`` / ``dbias`` (the design of
``triton_impl.py``). Shorter rows go one at a time, as in PyTorch's CPU LayerNorm backward: x
and dy are then two sequential streams, which the hardware prefetches (in a training step x comes
from DRAM), and the ``dweight`` row they add to stays in L1. ``normlab-bench`` shows the effect.

Semantics (last dimension of size d normalised; as ``reference.py`` and ``triton_impl.py``):

* LayerNorm (Ba et al. 2016, arXiv:1607.06450): ``y = (x - mean) * rsqrt(var + eps) * w + b``,
  biased variance (two passes over the row: no cancellation), eps inside the square root.
* RMSNorm (Zhang & Sennrich 2019, arXiv:1910.07467): ``y = x * rsqrt(mean(x^2) + eps) * w``.
* dtypes: fp32, fp64, bf16, fp16 input. Statistics and every sum in fp32 (fp64 for fp64 input),
  a row's statistics in blocks of 4096 elements whose sums are added in double (so rows of
  millions of elements keep fp32 accuracy, as PyTorch's own; summed straight they would not);
  ``x_hat`` rounded to the input dtype, times ``w`` rounded to the input dtype, rounded, plus ``b``,
  rounded: the roundings of the eager reference (``reference.py``), so a bf16/fp16 output equals the
  reference's except where the statistics, summed in another order, put ``x_hat`` on the other side
  of a rounding tie (rare, one unit apart). PyTorch's own ``F.layer_norm`` / ``F.rms_norm`` round
  once, at the end, and so differ from both in many bf16 elements.
  With AVX512-BF16, ``vdpbf16ps`` / ``vcvtneps2bf16`` read bf16 values below 1.2e-38 as zero.
* Saved for backward: x as contiguous ``(rows, d)`` (a copy when the input was not contiguous),
  the weight as the kernel takes it, ``mean`` and ``rstd`` ``(rows,)`` (``mean`` is zeros for
  RMSNorm: one op signature for both kinds).
* Backward with ``g = dy * w``: ``dx = rstd * (g - mean_d(g) - x_hat * mean_d(g * x_hat))``
  (RMSNorm without ``mean_d(g)``), ``dw = sum_rows(dy * x_hat)``, ``db = sum_rows(dy)``: column sums
  kept in fp32 per thread, summed in fp32 in thread order by the kernel, cast to the parameter dtype
  at the end. The rows each
  thread takes depend on the thread count, so ``dw`` / ``db`` change in the last fp32 bits with it,
  as with PyTorch's own CPU LayerNorm; fixed threads give
  bit-identical results.

Any leading shape; non-contiguous input is copied to contiguous rows first. CPU tensors only: the
config refuses ``impl=cpp`` on other devices (:func:`normlab.norms.resolve_norm`).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import ClassVar

import torch
import torch.autograd.forward_ad as fwAD

from normlab.config import ConfigError
from normlab.norms.reference import NormBase

SOURCE = Path(__file__).with_name("cpu_kernels.cpp")
log = logging.getLogger(__name__)


def _isa_flags() -> tuple[str, list[str]]:
    """``(isa name, compiler flags)``: inductor's choice of vector ISA for this CPU, so the kernels
    use the same ``at::vec`` code path (and bf16 instructions) as ``torch.compile`` would.

    Picking imports inductor and builds its probe kernels (seconds, at every process start), so
    the pick is kept in ``normlab_isa_<key>.json`` under the extensions root
    (``TORCH_EXTENSIONS_DIR`` or torch's default), ``key`` a hash of torch's version and this
    CPU's model and flags (``/proc/cpuinfo``): another CPU or torch picks anew. An unreadable file
    is picked anew too."""
    from torch.utils import cpp_extension

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    key = hashlib.sha256(f"{torch.__version__} {_cpu_identity()}".encode()).hexdigest()[:16]
    cache = Path(root) / f"normlab_isa_{key}.json"
    with contextlib.suppress(OSError, ValueError, TypeError):
        name, flags = json.loads(cache.read_text())
        return str(name), [str(f) for f in flags]
    name, flags = _pick_isa()
    with contextlib.suppress(OSError):  # a read-only root: pick again next time
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps([name, flags]))
        tmp.replace(cache)  # atomic: a concurrent reader sees the whole file or none
    return name, flags


def _cpu_identity() -> str:
    """This CPU's model name and feature flags from ``/proc/cpuinfo`` (Linux), else the platform's
    processor and machine strings."""
    with contextlib.suppress(OSError):
        info = Path("/proc/cpuinfo").read_text().splitlines()
        wanted = [ln for ln in info if ln.split(":")[0].strip() in ("model name", "flags")]
        return " ".join(dict.fromkeys(wanted))  # one entry per distinct line (one per core)
    return f"{platform.processor()} {platform.machine()}"


def _pick_isa() -> tuple[str, list[str]]:
    """Inductor's pick (:func:`_isa_flags`); ``("generic", [])`` (portable scalar code) with a torch
    that lacks ``torch._inductor.cpu_vec_isa``."""
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        isa = pick_vec_isa()
        if isa:
            flags = isa.build_arch_flags().split() + [f"-D{m}" for m in isa.build_macro() if m]
            if (
                "-mavx512f" in flags
                and "-mavx512bf16" not in flags
                and torch.cpu._is_avx512_bf16_supported()
            ):
                flags.append("-mavx512bf16")  # vdpbf16ps for bf16 row sums (cpu_kernels.cpp)
            return re.sub(r"\W+", "_", str(isa)), flags
    except Exception:  # noqa: BLE001  (an older torch without this module: portable scalar code)
        pass
    return "generic", []


#: Seconds a run waits for another process that is building the same kernels before it refuses
#: (``NORMLAB_BUILD_WAIT_S`` overrides it); a build takes seconds, so this only ends a real stall.
BUILD_WAIT_S = 600.0


def build(name: str, source: Path, flags: list[str]) -> None:
    """``torch.utils.cpp_extension.load`` of one C++ file registering torch ops (no Python module).

    Builds are serialised by an ``flock`` on ``<build dir>/normlab.lock``, which the kernel releases
    when its holder dies, so a killed build never blocks a later one. Under that lock no other
    normlab process is building, so the ``lock`` file torch's own ``FileBaton`` leaves behind when
    a build is killed (SIGTERM from ``timeout`` or SLURM) is stale: it is removed, with a warning,
    instead of being waited on forever. A run that must wait for a live builder says so, names its
    pid, and refuses after :data:`BUILD_WAIT_S`.

    Raises:
        ConfigError: ninja missing; the compiler failed (first line of its error); another process
            held the build lock longer than the wait allows.
    """
    from torch.utils import cpp_extension

    if shutil.which("ninja") is None and not _ninja_module():
        raise ConfigError(
            "norm.impl=cpp needs ninja to build its kernels: pip install ninja "
            "(or choose norm.impl=torch)"
        )
    build_dir = Path(cpp_extension._get_build_directory(name, verbose=False))
    with _build_lock(build_dir):
        baton = build_dir / "lock"
        if baton.exists():
            log.warning("normlab: removing a stale build lock left by a killed build: %s", baton)
            baton.unlink(missing_ok=True)
        # ninja's build file names the source by path: building from a copy in the build dir
        # (the name already hashes the source) keeps another checkout or install of the same
        # source from rebuilding, and the next run in this one from rebuilding again
        copy = build_dir / source.name
        if not copy.is_file() or copy.read_bytes() != source.read_bytes():
            shutil.copyfile(source, copy)
        if not (build_dir / f"{name}.so").exists():
            log.warning(
                "normlab: building the C++ norm kernels for this machine (norm.impl=cpp, once; "
                "seconds) in %s",
                build_dir,
            )
        try:
            # -fopenmp: at::parallel_for is OpenMP compiled into this library (serial without it);
            # the process already holds torch's libgomp.so.1: the kernels share its thread pool.
            with _compiler_dies_with_us():
                cpp_extension.load(
                    name=name,
                    sources=[str(copy)],
                    extra_cflags=["-O3", "-fopenmp", *flags],
                    extra_ldflags=["-fopenmp"],
                    is_python_module=False,
                    verbose=False,
                )
        except Exception as e:  # noqa: BLE001
            first = (str(e).strip().splitlines() or [type(e).__name__])[0].split(": [")[0][:200]
            raise ConfigError(
                f"norm.impl=cpp could not build its C++ kernels ({first}); "
                "choose norm.impl=torch or reference "
                "(compiled needs a C++ compiler too)"
            ) from e


class _Terminated(BaseException):
    """SIGTERM arrived while the kernels were building (see :func:`_compiler_dies_with_us`)."""


@contextlib.contextmanager
def _compiler_dies_with_us():
    """While the kernels build, SIGTERM (what ``timeout``, ``kill`` and SLURM send) ends the build's
    processes (ninja and the compilers it started: every descendant of this process) and raises
    inside the build instead of ending the process at once, so torch's ``finally`` releases its
    lock and no compiler outlives the run to write into the build folder while the next run builds
    there. The signal is then delivered again to the handler
    that was there before (by default: the process ends, exit status 143). Outside the main thread,
    where handlers cannot be set, it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, frame: object) -> None:
        # stop the whole tree first: a process ninja or the driver starts between a scan and the
        # kill of its parent would be orphaned (no longer a descendant) and outlive the run
        stopped: list[int] = []
        for _ in range(100):
            new = [p for p in _descendants(os.getpid()) if p not in stopped]
            if not new:
                break
            for pid in new:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            stopped += new
        for pid in reversed(stopped):  # the compilers before ninja
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
                os.kill(pid, signal.SIGCONT)  # a stopped process acts on its SIGTERM once resumed
        raise _Terminated(signum)

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, previous)
        os.kill(os.getpid(), signal.SIGTERM)
        raise KeyboardInterrupt from None  # a handler of the caller's took the signal and returned
    finally:
        signal.signal(signal.SIGTERM, previous)


def _descendants(pid: int) -> list[int]:
    """Every live descendant of process ``pid``, parents before their children (Linux ``/proc``;
    empty where it is missing)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        out.append(todo.pop(0))
        todo += children.get(out[-1], [])
    return out


@contextlib.contextmanager
def _build_lock(build_dir: Path):
    """Hold an exclusive ``flock`` on ``build_dir/normlab.lock`` (the file stays; the lock dies with
    its process). Waits for a live holder with a notice naming its pid, at most
    ``$NORMLAB_BUILD_WAIT_S`` (default :data:`BUILD_WAIT_S`) seconds.

    Raises:
        ConfigError: the wait ran out (naming the lock file and the holder's pid).
    """
    build_dir.mkdir(parents=True, exist_ok=True)
    path = build_dir / "normlab.lock"
    wait_s = float(os.environ.get("NORMLAB_BUILD_WAIT_S", BUILD_WAIT_S))
    with open(path, "a+") as f:
        deadline = time.monotonic() + wait_s
        announced = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                f.seek(0)
                holder = f.read().strip() or "unknown"
                if time.monotonic() >= deadline:
                    raise ConfigError(
                        f"norm.impl=cpp: process {holder} has held the kernel build lock {path} "
                        f"for over {wait_s:g} s; wait for it, stop it, or choose norm.impl=torch"
                    ) from None
                if not announced:
                    log.warning(
                        "normlab: waiting (up to %g s) for process %s, which is building the C++ "
                        "norm kernels in %s",
                        wait_s,
                        holder,
                        build_dir,
                    )
                    announced = True
                time.sleep(0.2)
        try:
            f.seek(0)
            f.truncate()
            f.write(str(os.getpid()))
            f.flush()
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _ninja_module() -> bool:
    try:
        import ninja  # noqa: F401  (the PyPI wheel puts the binary on PATH of its environment)

        return True
    except ImportError:
        return False


def _register_fakes() -> None:
    """Shapes and dtypes of the ops for ``torch.compile`` of a model that uses them
    (``compile=true``)."""

    @torch.library.register_fake("normlab_cpu::norm")
    def _norm(x, weight, bias, eps, rms):
        return torch.empty_like(x)

    @torch.library.register_fake("normlab_cpu::norm_fwd")
    def _fwd(x, weight, bias, eps, rms):
        acc = torch.promote_types(x.dtype, torch.float32)
        return (
            torch.empty_like(x),
            x.new_empty(x.shape[0], dtype=acc),
            x.new_empty(x.shape[0], dtype=acc),
        )

    @torch.library.register_fake("normlab_cpu::norm_bwd")
    def _bwd(dy, x, weight, mean, rstd, rms):
        dw = x.new_empty(x.shape[1], dtype=mean.dtype)
        return torch.empty_like(x), dw, dw.new_empty(0 if rms else x.shape[1])


@functools.cache
def ops() -> object:
    """Compile (once per machine, kernel source and ISA) and load the kernels, register their fake
    (meta) implementations; returns ``torch.ops.normlab_cpu``.

    Raises:
        ConfigError: no ninja, or the build failed (one line; the compiler's output is in the
            cause).
    """
    isa, flags = _isa_flags()
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode()).hexdigest()[:10]
    build(f"normlab_cpu_norms_{isa}_{digest}", SOURCE, flags)
    _register_fakes()
    _NORM[0] = torch.ops.normlab_cpu.norm.default._op
    return torch.ops.normlab_cpu


#: The C++ builtin behind ``torch.ops.normlab_cpu.norm.default`` (set by :func:`ops`): called
#: directly in eager mode, it skips the two Python frames of ``OpOverloadPacket`` / ``OpOverload``.
_NORM: list = [None]
#: The functorch transform stack (None: no ``torch.func`` transform is active).
_interpreters = torch._C._functorch.peek_interpreter_stack


class _CppNorm(NormBase):
    """Both kinds through the same kernels; subclasses set ``is_rms``. Building (or loading) the
    kernels happens in ``__init__``: a missing compiler is a config error before training starts."""

    is_rms: ClassVar[bool]

    def __init__(
        self,
        d: int,
        eps: float,
        affine: bool = True,
        bias: bool = False,
        upcast: bool = True,
        **options,
    ):
        super().__init__(d, eps, affine, bias, upcast, **options)
        ops()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # dynamo sees the op (OpOverload) and its fake
            self.check_input(x)
            return torch.ops.normlab_cpu.norm.default(
                x, self.weight, self.bias, self.eps, self.is_rms
            )
        # The full check_input only where forward-mode tangents can exist (a dual level or a
        # functorch transform is active): the common call pays a few attribute reads, no more.
        if x.shape[-1] != self.d or fwAD._current_level >= 0 or _interpreters() is not None:
            self.check_input(x)
        if not x.is_cpu:
            raise ValueError(f"norm.impl=cpp runs on CPU tensors only, got {x.device}")
        return _NORM[0](x, self.weight, self.bias, self.eps, self.is_rms)


class CppLayerNorm(_CppNorm):
    """Fused C++ LayerNorm for CPU; ``(..., d)`` in, same shape and dtype out. Statistics always in
    fp32 (the norm table: it does not honour ``upcast=false``, refused by ``resolve_norm``)."""

    is_rms = False


class CppRMSNorm(_CppNorm):
    """Fused C++ RMSNorm for CPU; ``(..., d)`` in, same shape and dtype out; no bias."""

    is_rms = True
