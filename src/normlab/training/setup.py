"""``build_run(cfg, run_dir, opts) -> Run``: the one place a training setup is assembled.

Training, ``normlab-bench step``, the studies and the tests all build their setup here. Every
check that can refuse a run comes first, before anything is built or written; then the model from
the seed, AdamW, the scaler, the resumed state and the compiled forward. Building a run changes no
global setting of torch (``forbid_eager_fallback`` is a context around the steps).

Why: docs/ARCHITECTURE.md
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from normlab.config import (
    ConfigError,
    NormImpl,
    NormWeightDecay,
    OptimConfig,
    OptimName,
    RunOptions,
    Tokenizer,
    TrainConfig,
    to_plain,
)
from normlab.data.eval_sets import eval_data_configs
from normlab.data.tokens import BatchSampler, TokenData, prepare
from normlab.model import GPT
from normlab.norms import resolve_norm
from normlab.norms.preflight import preflight_model
from normlab.training import distributed
from normlab.training.checkpoint import Loaded
from normlab.training.diagnostics import named_norms
from normlab.training.distributed import resolve_device, seed_everything
from normlab.training.host_memory import host_memory, keep_freed_memory, release_freed_memory
from normlab.training.peak import device_name
from normlab.training.precision import DTYPES, autocast, check_precision, grad_scaler
from normlab.training.resume import check_free_space, check_resumable, find_resume_point
from normlab.training.sample import check_tokenizer
from normlab.training.validation import EvalSet, build_eval_sets

#: Devices where AdamW runs fused (on CUDA its step counters and the scaler's inf check stay on the
#: device). CPU keeps foreach: fused AdamW there rounds differently and would change every result.
FUSED_ADAMW_DEVICES = ("cuda",)

log = logging.getLogger(__name__)


@dataclass
class Run:
    """One training setup from ``build_run``: ``cfg`` resolved (``norm.impl``, ``vocab_size``);
    ``ddp`` is ``model`` (DDP-wrapped with several processes), ``fwd`` it maybe compiled;
    ``state`` the resumed checkpoint's loop state (empty for a new run)."""

    cfg: TrainConfig
    device: torch.device
    data: TokenData
    model: GPT
    ddp: torch.nn.Module
    fwd: Callable
    eval_fwd: Callable
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    sampler: BatchSampler
    config_dict: dict[str, Any]
    preflight: dict[str, Any] = field(default_factory=dict)
    resume: Loaded | None = None
    forced_diff: list[str] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    evals: list[EvalSet] = field(default_factory=list)  # one per eval_data corpus
    downstream: Any = None  # normlab.evals.DownstreamEval of eval_tasks (training cannot import it)

    @property
    def start(self) -> int:
        """The step to continue from (0 for a new run): batches are a pure function of the step."""
        return int(self.state.get("step", 0))

    def autocast(self) -> contextlib.AbstractContextManager:
        """The forward-pass context of the run's precision."""
        return autocast(self.cfg.precision.dtype, self.device)


def make_optimizer(
    model: torch.nn.Module, cfg: OptimConfig, device: torch.device
) -> torch.optim.Optimizer:
    """AdamW, decaying matrices (dim >= 2) and the gains of ``decayed_gains``, no other 1-D
    parameter; fused on ``FUSED_ADAMW_DEVICES``, foreach elsewhere."""
    assert cfg.name == OptimName.adamw  # the Enum has no other member
    gains = {id(p) for p in decayed_gains(model, cfg.norm_weight_decay)}
    decay = [p for p in model.parameters() if p.requires_grad and (p.dim() >= 2 or id(p) in gains)]
    no_decay = [
        p for p in model.parameters() if p.requires_grad and p.dim() < 2 and id(p) not in gains
    ]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = device.type in FUSED_ADAMW_DEVICES
    return torch.optim.AdamW(
        groups,
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=fused or None,
        foreach=None if fused else True,
    )


def decayed_gains(model: torch.nn.Module, which: NormWeightDecay) -> list[torch.nn.Parameter]:
    """The norm gains (``weight``) of a ``GPT`` that ``optim.norm_weight_decay=which`` decays, in
    depth order: ``all``, ``input_only`` (``attn_in``, ``mlp_in``) or ``none``."""
    if which == NormWeightDecay.none:
        return []
    gains = []
    for name, _, module in named_norms(model):
        weight = getattr(module, "weight", None)
        is_input = name.endswith(("/attn_in", "/mlp_in"))
        if isinstance(weight, torch.nn.Parameter) and (which == NormWeightDecay.all or is_input):
            gains.append(weight)
    return gains


def build_model(cfg: TrainConfig, device: torch.device | str) -> GPT:
    """Seed every generator with ``cfg.weights_seed`` and build the GPT on ``device`` (``cfg.norm``
    resolved, ``vocab_size`` set); norm variants share their common initial weights."""
    seed_everything(cfg.weights_seed)
    return GPT(cfg.model, cfg.norm).to(device)


def forbid_eager_fallback(cfg: TrainConfig) -> contextlib.AbstractContextManager:
    """A context in which ``torch.compile`` raises at its recompile limit instead of running
    eagerly from then on; a no-op for a ``cfg`` that compiles nothing."""
    if not (cfg.compile or cfg.norm.impl == NormImpl.compiled):
        return contextlib.nullcontext()  # importing dynamo is slow
    import torch._dynamo

    # else a run would measure another program than it says; the patch restores dynamo's config
    return torch._dynamo.config.patch(fail_on_recompile_limit_hit=True)


def describe_error(e: BaseException) -> str:
    """``"<type>: <message>"`` of an exception that ended a run; the recompile limit under
    ``forbid_eager_fallback`` in words."""
    if type(e).__name__ == "FailOnRecompileLimitHit":
        import torch._dynamo

        limit = torch._dynamo.config.recompile_limit
        return (
            f"{type(e).__name__}: torch.compile compiled one function more than its "
            f"recompile_limit={limit} times (each new input shape, dtype or constant is a new "
            "graph); normlab refuses to let it fall back to eager silently: keep the inputs "
            "stable, or raise torch._dynamo.config.recompile_limit"
        )
    return f"{type(e).__name__}: {e}"


def _check_grad_accum(cfg: TrainConfig) -> None:
    world = distributed.world_size()
    if cfg.optim.grad_accum % world:
        raise ConfigError(
            f"optim.grad_accum={cfg.optim.grad_accum} is not divisible by the {world} processes: "
            f"the {cfg.optim.grad_accum} micro-batches of a step are shared out among them; "
            f"use a multiple of {world}"
        )


def _check_downstream(cfg: TrainConfig, downstream: Any) -> None:
    """``eval_tasks`` and the evaluator built for them agree (``commands/train.py`` builds it:
    ``normlab.evals`` sits above ``training``, which cannot import it)."""
    names = tuple(getattr(downstream, "names", ()))
    if tuple(cfg.eval_tasks) != names or (
        downstream is not None and downstream.limit != cfg.eval_task_items
    ):
        raise ConfigError(
            f"eval_tasks={list(cfg.eval_tasks)} needs a normlab.evals.DownstreamEval of those "
            f"tasks and eval_task_items={cfg.eval_task_items} passed as train(downstream=...) "
            f"(the train command builds it); got {downstream!r}"
        )


def _load_state(resume: Loaded, model: GPT, optimizer, scaler) -> dict[str, Any]:
    """Load a checkpoint's weights, optimizer and scaler state; the rest of its state (the loop's),
    with the checkpoint's tensors freed."""
    state = resume.state
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if state["scaler"]:  # empty when saved without a scaler (fp32/bf16)
        scaler.load_state_dict(state["scaler"])
    resume.state = None  # free the loaded tensors
    return {k: v for k, v in state.items() if k not in ("model", "optimizer", "scaler")}


def build_run(
    cfg: TrainConfig,
    run_dir: Path | None = None,
    opts: RunOptions | None = None,
    downstream: Any = None,
) -> Run:
    """Check ``cfg`` for this machine, then build the run (``run_dir`` None: no resume, no space
    check; ``downstream``: the ``DownstreamEval`` of ``eval_tasks``, tokenized here). Raises
    ConfigError, DataError naming the bad value, before anything is built or written."""
    opts = opts or RunOptions()
    # --- every refusing check: nothing below them is built or written if one fails
    _check_grad_accum(cfg)
    _check_downstream(cfg, downstream)
    eval_cfgs = eval_data_configs(list(cfg.eval_data), cfg.data, opts.conf_dir)
    device = resolve_device(cfg.device)
    norm_cfg = resolve_norm(cfg.norm, device.type)
    check_precision(cfg.precision.dtype, device)
    # each norm in the dtype it receives under autocast (see norms/preflight.py)
    norm_check = preflight_model(norm_cfg, cfg.model, device, DTYPES[cfg.precision.dtype])
    data = prepare(cfg.data)
    evals = build_eval_sets(cfg, eval_cfgs, data.directory, device)  # tokenized like the data
    vocab = cfg.model.vocab_size or data.vocab_size
    if vocab < data.vocab_size:
        raise ConfigError(
            f"model.vocab_size={vocab} is smaller than the tokenizer's {data.vocab_size}"
        )
    if downstream is not None:  # reads the package's files: a refusal comes before the build
        downstream.prepare(data.load_tokenizer(), cfg.model.context_length)
    cfg = dataclasses.replace(
        cfg, norm=norm_cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab)
    )
    config_dict = to_plain(cfg)
    resume = find_resume_point(run_dir, opts.resume) if run_dir is not None else None
    with torch.device("meta"):  # shapes and sizes only: no memory, no random numbers
        shapes = GPT(cfg.model, cfg.norm)
    forced = check_resumable(resume, config_dict, shapes, opts.force) if resume else []
    if resume and cfg.data.tokenizer == Tokenizer.bpe:  # only a BPE is trained again, and differs
        if notice := check_tokenizer(data.load_tokenizer(), run_dir):
            log.warning(notice)
    if run_dir is not None:
        check_free_space(run_dir, shapes, opts.ckpt_keep)
    # --- build: the model from the seed, AdamW, the grad scaler, the resumed state, the forward
    if device.type == "cpu":  # no page faults for the same activations every step (host_memory)
        keep_freed_memory()
    model = build_model(cfg, device)
    optimizer = make_optimizer(model, cfg.optim, device)
    scaler = grad_scaler(cfg.precision, device)
    state = _load_state(resume, model, optimizer, scaler) if resume else {}
    ddp = distributed.wrap(model, device)  # the model itself in a single process
    fwd = torch.compile(ddp) if cfg.compile else ddp
    eval_fwd = fwd if ddp is model else torch.compile(model) if cfg.compile else model
    sampler = BatchSampler(
        data, cfg.data.batch_size, cfg.model.context_length, cfg.order_seed, device
    )
    return Run(
        cfg=cfg,
        device=device,
        data=data,
        model=model,
        ddp=ddp,
        fwd=fwd,
        eval_fwd=eval_fwd,
        optimizer=optimizer,
        scaler=scaler,
        sampler=sampler,
        config_dict=config_dict,
        preflight=norm_check,
        resume=resume,
        forced_diff=forced,
        state=state,
        evals=evals,
        downstream=downstream,
    )


def versions(device: torch.device, compiled: bool) -> dict[str, Any]:
    """Versions and hardware that change numbers, recorded with every run: torch, triton, CUDA,
    ``device``, ``cpu_model`` (the report's device line), ``compile``, ``malloc``."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "device": name or platform.processor() or "cpu",
        "cpu_model": device_name(torch.device("cpu")),
        "compile": compiled,
        "malloc": host_memory(),
    }


def free_memory() -> None:
    """Release what a finished run leaves: garbage, torch.compile's caches, cached CUDA blocks,
    the heap's free pages; so the jobs of a multirun start clean."""
    gc.collect()
    if "torch._dynamo" in sys.modules:  # only if something was compiled; importing it is slow
        torch.compiler.reset()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    release_freed_memory()
