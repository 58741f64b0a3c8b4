"""Several processes, one model: the process group, rank helpers, collectives, pre-emption signals.

One process per device, ranks from torchrun's variables or, under submitit, from the job
environment (``setup``). In a single process no group is created and every helper is a no-op that
returns its input. Backend: gloo without CUDA; with CUDA ``cpu:gloo,cuda:nccl`` (NCCL for
gradients, gloo for small CPU-side exchanges). ``signals.py``'s stop signals are re-exported here.

Why: docs/running.md
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from normlab.config import ConfigError
from normlab.training import resume
from normlab.training.signals import StopSignals, preempt_handler, preempt_signal

__all__ = ["StopSignals", "preempt_handler", "preempt_signal"]  # and the functions below

log = logging.getLogger(__name__)


# --- the process group ----------------------------------------------------------------------------


def _submitit_env():
    """submitit's job environment for one of several tasks not started by torchrun, else None."""
    if "RANK" in os.environ or "SUBMITIT_EXECUTOR" not in os.environ:
        return None
    try:
        import submitit

        env = submitit.JobEnvironment()
        return env if env.num_tasks > 1 else None
    except Exception as e:  # a submitit variable without a usable job environment
        log.warning("submitit job environment unreadable (%s); running as a single process", e)
        return None


def setup() -> None:
    """Join the process group when launched as one of several processes, once (a multirun's jobs
    share it); nothing for a single one. Left at exit (``teardown``)."""
    if dist.is_initialized():
        return
    sub = _submitit_env()
    if sub is not None:  # master: the first node; port: from the job id
        from submitit.helpers import TorchDistributedEnvironment

        TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    cuda = torch.cuda.is_available() and dist.is_nccl_available()
    if cuda and local_rank() < torch.cuda.device_count():
        torch.cuda.set_device(local_rank())
    dist.init_process_group(backend="cpu:gloo,cuda:nccl" if cuda else "gloo")
    atexit.register(teardown)
    log.debug("process group: rank %d of %d", rank(), world_size())


def teardown() -> None:
    """Leave the process group (a no-op when there is none)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def local_rank() -> int:
    """Index of this process on its node: the CUDA device it trains on."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_main() -> bool:
    """Rank 0: the only process that writes logs, metrics, the summary, checkpoints and wandb."""
    return rank() == 0


# --- collectives (no-ops in a single process) -----------------------------------------------------


def broadcast(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` (picklable) on every rank."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_rows(values: torch.Tensor) -> torch.Tensor:
    """``(world_size, n)`` on the CPU: every rank's ``values`` flattened, in rank order, on every
    rank (so sums over ranks give the same bits everywhere)."""
    values = values.detach().reshape(-1).cpu()
    if world_size() == 1:
        return values[None]
    rows = [torch.empty_like(values) for _ in range(world_size())]
    dist.all_gather(rows, values)
    return torch.stack(rows)


def all_reduce_max(value: int) -> int:
    """The largest of every rank's ``value``, on every rank."""
    if world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


# --- the model and its gradients ------------------------------------------------------------------


def wrap(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` in DistributedDataParallel with several processes, else ``model`` itself."""
    if world_size() == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )


def sync_gradients(module: torch.nn.Module, sync: bool):
    """Context for a micro-batch's backward: ``no_sync`` (gradients stay local) unless ``sync``."""
    if sync or not hasattr(module, "no_sync"):
        return contextlib.nullcontext()
    return module.no_sync()


def shard(n: int) -> range:
    """This rank's share of ``0..n-1``: rank, rank + N, rank + 2N, ..."""
    return range(rank(), n, world_size())


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu; ``cuda`` is ``cuda:<LOCAL_RANK>`` with several
    processes. Raises ConfigError for absent CUDA or one ``cuda:N`` for several processes."""
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name
    )
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"device={name!r} is not available on this machine (no CUDA); allowed here: auto, cpu"
        )
    if device.type == "cuda" and world_size() > 1:
        if device.index is not None:
            raise ConfigError(
                f"device={name} cannot be shared by {world_size()} processes: use device=cuda or "
                "auto (each process takes cuda:<LOCAL_RANK>)"
            )
        if local_rank() >= torch.cuda.device_count():
            raise ConfigError(
                f"device={name}: process {local_rank()} of this node has no GPU of its own "
                f"({torch.cuda.device_count()} here): start at most one process per GPU"
            )
        device = torch.device("cuda", local_rank())
    return device


# --- random number generators ---------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (CPU and every CUDA device) generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def seed_rank(seed: int, step: int) -> None:
    """Give ranks > 0 their own RNG streams (dropout masks), derived from ``(seed, step, rank)``;
    rank 0 keeps its stream, the one a single process has."""
    if rank() > 0:
        seed_everything(int(np.random.SeedSequence([seed, step, rank()]).generate_state(1)[0]))


def restore_rank_rng(states: list[dict[str, Any]], seed: int, step: int) -> None:
    """Restore this rank's RNG states from a checkpoint's (one per rank); with another number of
    processes every rank takes rank 0's, then ``seed_rank``."""
    if len(states) == world_size():
        resume.restore_rng(states[rank()])
    else:
        resume.restore_rng(states[0])
        seed_rank(seed, step)
