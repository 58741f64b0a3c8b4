"""normlab's fused C++ LayerNorm and RMSNorm for CPU (``norm.impl=cpp``), forward and backward.

Semantics and roundings are the reference's (``reference.py``); ``dw`` / ``db`` change in the
last fp32 bits with the thread count (fixed threads: bit-identical). Any leading shape, CPU
tensors only. ``cpu_kernels.cpp`` is built on first use (g++, ninja), cached in
``TORCH_EXTENSIONS_DIR`` by a hash of source and flags, as ``torch.ops.normlab_cpu``: ``norm``
(autograd in C++) and the kernels ``norm_fwd`` / ``norm_bwd`` (saving x, ``mean``, ``rstd``).

Why: docs/norms.md
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
    """``(isa name, compiler flags)``: inductor's vector ISA for this CPU (``torch.compile``'s
    ``at::vec`` path), kept in ``normlab_isa_<key>.json`` under the extensions root, ``key`` a hash
    of torch's version and this CPU's model and flags; an unreadable file is picked anew."""
    from torch.utils import cpp_extension

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    key = hashlib.sha256(f"{torch.__version__} {_cpu_identity()}".encode()).hexdigest()[:16]
    cache = Path(root) / f"normlab_isa_{key}.json"  # picking builds inductor's probe kernels
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
    """Inductor's pick (``_isa_flags``); ``("generic", [])`` (portable scalar code) with a torch
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
#: (``NORMLAB_BUILD_WAIT_S`` overrides it); a build takes a minute or two, so this ends a stall.
BUILD_WAIT_S = 600.0


def build(name: str, source: Path, flags: list[str]) -> None:
    """``cpp_extension.load`` of one C++ file registering torch ops, serialised by ``_build_lock``.
    ConfigError: ninja missing, the compiler failed (first line), the lock wait ran out."""
    from torch.utils import cpp_extension

    if shutil.which("ninja") is None and not _ninja_module():
        raise ConfigError(
            "norm.impl=cpp needs ninja to build its kernels: pip install ninja "
            "(or choose norm.impl=torch)"
        )
    build_dir = Path(cpp_extension._get_build_directory(name, verbose=False))
    with _build_lock(build_dir):
        baton = build_dir / "lock"  # torch's FileBaton, stale under our lock (a killed build)
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
                "normlab: building the C++ norm kernels for this machine (norm.impl=cpp, once: "
                "about a minute or two, longer on a busy machine) in %s",
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
    """SIGTERM arrived while the kernels were building (see ``_compiler_dies_with_us``)."""


@contextlib.contextmanager
def _compiler_dies_with_us():
    """While the kernels build, SIGTERM ends every descendant (ninja, compilers) and raises inside
    the build, so torch's ``finally`` releases its lock and no compiler outlives the run; the signal
    then goes to the previous handler (default: exit 143). A no-op outside the main thread."""
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
    """Hold an exclusive ``flock`` on ``build_dir/normlab.lock`` (it dies with its process); wait
    for a live holder, naming its pid, at most ``$NORMLAB_BUILD_WAIT_S`` (default ``BUILD_WAIT_S``)
    seconds, then ConfigError."""
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
    """``torch.ops.normlab_cpu``, built once per machine, kernel source and ISA, fakes registered.
    ConfigError: no ninja, or the build failed (one line; the compiler's output is the cause)."""
    isa, flags = _isa_flags()
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode()).hexdigest()[:10]
    build(f"normlab_cpu_norms_{isa}_{digest}", SOURCE, flags)
    _register_fakes()
    _NORM[0] = torch.ops.normlab_cpu.norm.default._op
    return torch.ops.normlab_cpu


#: The C++ builtin behind ``torch.ops.normlab_cpu.norm.default`` (set by ``ops``): called
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
