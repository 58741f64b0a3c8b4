"""Text from a trained run: its newest valid checkpoint, the model it trained, its tokenizer.

``load_run`` rebuilds the GPT from the checkpoint's resolved config (shape and norm) and loads its
weights, with the run's tokenizer held to the digest the run recorded (``check_tokenizer``).
``generate`` samples autoregressively as nanoGPT's ``sample.py`` does: temperature, top-k, one
seeded ``torch.Generator``, fp32, dropout off. A prompt is refused unless
``decode(encode(prompt)) == prompt``; an empty one starts after the document separator.

Why: docs/running.md
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Any, get_type_hints

import numpy as np
import torch

from normlab.config import ConfigError, DataConfig, ModelConfig, NormConfig, NormImpl, Tokenizer
from normlab.config.files import load_json
from normlab.data import tokenizer as tt
from normlab.data.corpus import DataError
from normlab.data.shards import META
from normlab.data.tokens import prepare, token_dir
from normlab.model import GPT
from normlab.norms import resolve_norm
from normlab.training.checkpoint import CKPT_DIR, load_latest, upgrade_model_state
from normlab.training.distributed import resolve_device
from normlab.training.resume import shape_mismatches

_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


@dataclass(frozen=True)
class SampleOptions:
    """What to generate; ``top_k`` None: no cut. Raises ConfigError for ``max_new_tokens`` or
    ``num_samples`` < 1, ``temperature`` not finite > 0, ``top_k`` < 1, ``seed`` < 0."""

    max_new_tokens: int = 500
    temperature: float = 0.8
    top_k: int | None = 200
    num_samples: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        for key, ok, allowed in [
            ("max_new_tokens", self.max_new_tokens >= 1, "must be >= 1"),
            ("num_samples", self.num_samples >= 1, "must be >= 1"),
            (
                "temperature",
                math.isfinite(self.temperature) and self.temperature > 0,
                "must be a finite number > 0 (smaller: closer to always taking the likeliest)",
            ),
            ("top_k", self.top_k is None or self.top_k >= 1, "must be >= 1 (1: greedy decoding)"),
            ("seed", self.seed >= 0, "must be >= 0"),
        ]:
            if not ok:
                raise ConfigError(f"--{key.replace('_', '-')}={getattr(self, key)}: {allowed}")


@dataclass
class TrainedRun:
    """A run's model in eval mode on ``device``, its tokenizer, and where they came from."""

    model: GPT
    tokenizer: Any  # normlab.data.tokenizer.{Byte,GPT2,BPE}Tokenizer
    step: int  # optimizer steps the checkpoint had taken
    checkpoint: Path
    skipped: list[str]  # damaged newer checkpoints, "name: why"
    norm: NormConfig  # the resolved norm the model was built with
    device: torch.device
    tokenizer_notice: str | None = None  # a run that recorded no tokenizer digest: unchecked


def build_section(cls, section: str, values: Any):
    """``cls(**values)`` from a checkpoint's plain config section, refusing what does not fit."""
    if not isinstance(values, dict):
        raise ConfigError(f"the checkpoint's config has no {section} section")
    unknown = sorted(set(values) - {f.name for f in fields(cls)})
    if unknown:
        raise ConfigError(
            f"the checkpoint's {section} config has keys this normlab does not know: "
            f"{', '.join(unknown)} (sample with the normlab version that trained it)"
        )
    values = dict(values)
    for name, hint in get_type_hints(cls).items():  # Enums are stored by member name
        if isinstance(hint, type) and issubclass(hint, Enum) and isinstance(values.get(name), str):
            if values[name] not in hint.__members__:
                raise ConfigError(f"the checkpoint's {section}.{name}={values[name]!r} is unknown")
            values[name] = hint[values[name]]
    return cls(**values)


def _norm(values: dict, device_type: str, impl: NormImpl | None) -> NormConfig:
    """The checkpoint's resolved norm (``impl`` replaces its implementation: same parameters)."""
    norm = build_section(NormConfig, "norm", values)
    return resolve_norm(norm if impl is None else dataclasses.replace(norm, impl=impl), device_type)


def run_tokenizer(data: DataConfig, run_dir: Path | None = None):
    """The tokenizer a run trained with; ``bpe`` from the first token folder with the recorded
    digest, else prepared again in this machine's cache. Raises DataError if it cannot load."""
    recorded = _run_data(run_dir).get("tokenizer_digest")
    try:
        if data.tokenizer != Tokenizer.bpe:
            return tt.load(data.tokenizer)
        for folder in _token_folders(data, run_dir):  # passing over one of another digest
            meta_path = folder / META
            meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
            same = meta.get("tokenizer") == "bpe" and meta.get("bpe_vocab_size") == (
                data.bpe_vocab_size
            )
            if same and (folder / tt.BPE_FILE).is_file():
                tok = tt.load(Tokenizer.bpe, folder)
                if not isinstance(recorded, str) or tt.digest(tok) == recorded:
                    return tok
    except tt.TokenizerError as e:
        raise DataError(str(e)) from None
    # prepared again in this machine's cache, never at a cache_dir or token_dir the run's
    # config names: a received run dir's config is not a place to write to
    return prepare(local_cache(data)).load_tokenizer()


def local_cache(data: DataConfig) -> DataConfig:
    """``data`` with this machine's cache in place of the ``cache_dir`` and ``token_dir`` it had."""
    return dataclasses.replace(data, cache_dir=None, token_dir=None)


def check_tokenizer(tokenizer, run_dir: Path) -> str | None:
    """Hold ``tokenizer`` to ``summary.json``'s ``data.tokenizer_digest``: a notice if the run
    recorded none, else None; raises DataError naming both digests if they differ."""
    record = _run_data(run_dir)
    recorded = record.get("tokenizer_digest")
    if not isinstance(recorded, str):
        return (
            f"{run_dir} records no tokenizer digest (a run from before they were recorded): its "
            f"{tokenizer.name} tokenizer is used unchecked"
        )
    found = tt.digest(tokenizer)
    if found != recorded:
        folder = record.get("cache") if isinstance(record.get("cache"), str) else "its token folder"
        raise DataError(
            f"the {tokenizer.name} tokenizer found for {run_dir} has digest {found}, not the "
            f"{recorded} the run trained with (summary.json's data.tokenizer_digest): trained "
            f"again on a corpus that changed since the run; put back {folder} (its "
            f"{tt.BPE_FILE}) or the corpus the run trained on, then try again"
        )
    return None


def _run_data(run_dir: Path | None) -> dict[str, Any]:
    """The ``data`` section of ``run_dir/summary.json`` (empty without one)."""
    summary = run_dir / "summary.json" if run_dir is not None else None
    if summary is None or not summary.is_file():
        return {}
    try:  # within limits: a run dir is not trusted (normlab.config.files)
        doc = load_json(summary)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {summary}: {e}") from None
    data_record = doc.get("data") if isinstance(doc, dict) else None
    return data_record if isinstance(data_record, dict) else {}


def _token_folders(data: DataConfig, run_dir: Path | None) -> list[Path]:
    found = []
    for where in (data, local_cache(data)):  # the run's folder, then where it is prepared again
        try:
            found.append(token_dir(where))
        except DataError:  # the corpus is not here: the summary may still name the folder
            pass
    cache = _run_data(run_dir).get("cache")
    if cache and isinstance(cache, str):
        found.append(Path(cache))
    return found


def load_run(run_dir: Path, device: str = "auto", norm_impl: NormImpl | None = None) -> TrainedRun:
    """The model and tokenizer of ``run_dir``'s newest valid checkpoint; ``norm_impl`` None: the
    run's. Raises ConfigError (no valid checkpoint, impl or weights that do not fit) and
    DataError (a tokenizer that cannot load or is not the run's)."""
    run_dir = Path(run_dir)
    if not _DEVICE.match(device):
        raise ConfigError(f"--device={device} is not allowed: auto, cpu, cuda, cuda:N")
    if not run_dir.is_dir():
        raise ConfigError(f"run dir {run_dir} does not exist")
    dev = resolve_device(device)
    loaded = load_latest(run_dir / CKPT_DIR)  # on the CPU: the optimizer state never moves
    if loaded.state is None:
        damaged = f": {len(loaded.skipped)} damaged ({loaded.skipped[0]})" if loaded.skipped else ""
        raise ConfigError(
            f"run dir {run_dir} has no valid checkpoint in {CKPT_DIR}/{damaged} "
            "(a run writes one every ckpt_interval steps and at its end)"
        )
    config = loaded.state.get("config") or {}
    model_cfg = build_section(ModelConfig, "model", config.get("model"))
    norm = _norm(config.get("norm"), dev.type, norm_impl)
    data = build_section(DataConfig, "data", config.get("data"))
    model = GPT(model_cfg, norm)
    try:  # legacy norm names (norm1, norm2, norm_f) become position names
        weights = upgrade_model_state(loaded.state["model"], norm.placement.name)
    except ValueError as e:
        raise ConfigError(f"{loaded.path}: {e}") from None
    mismatched = shape_mismatches(model, weights)
    if mismatched:
        raise ConfigError(
            f"{loaded.path} holds weights that do not fit its config: {'; '.join(mismatched[:3])}"
        )
    model.load_state_dict(weights)
    model.to(dev).eval()
    tokenizer = run_tokenizer(data, run_dir)
    notice = check_tokenizer(tokenizer, run_dir)
    if tokenizer.n_vocab > model_cfg.vocab_size:
        raise ConfigError(
            f"the {tokenizer.name} tokenizer has {tokenizer.n_vocab} ids, more than the model's "
            f"vocab_size={model_cfg.vocab_size}: it is not the tokenizer this run trained with"
        )
    step = int(loaded.state["step"])
    return TrainedRun(model, tokenizer, step, loaded.path, loaded.skipped, norm, dev, notice)


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """``prompt``'s token ids (empty for ``""``); raises ConfigError when it cannot be encoded
    (a lone surrogate) or ``decode(encode(prompt)) != prompt``."""
    try:  # every tokenizer here reads UTF-8 text: a lone surrogate is what none can encode
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConfigError(
            f"--prompt cannot be encoded by the {tokenizer.name} tokenizer at character {e.start} "
            f"({prompt[e.start]!r}: not valid UTF-8, e.g. a stray byte on the command line); "
            "use UTF-8 text"
        ) from None
    ids = [int(i) for i in tokenizer.encode([prompt])[0]]
    back = tokenizer.decode(ids)
    if back != prompt:
        at = next(
            (i for i, (a, b) in enumerate(zip(prompt, back, strict=False)) if a != b), len(back)
        )
        raise ConfigError(
            f"--prompt does not survive the {tokenizer.name} tokenizer: decode(encode(prompt)) "
            f"differs from character {at} on ({prompt[at : at + 10]!r} -> {back[at : at + 10]!r})"
        )
    return ids


@torch.no_grad()
def generate(
    model: GPT,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    generator: torch.Generator,
    vocab_limit: int | None = None,
) -> torch.Tensor:
    """Extend ``idx`` (B, T0) int64 by ``max_new_tokens`` ids drawn from the fp32 softmax of the
    last logits / ``temperature``, cut to ``top_k``; ids >= ``vocab_limit`` are never drawn.
    Returns (B, T0 + N) int64; ``top_k=1`` is greedy."""
    context = model.cfg.context_length
    # a context, not a decorator: the decorator would import torch._dynamo when this module loads
    with torch.compiler.set_stance("force_eager"):  # no compiled graph per context length
        for _ in range(max_new_tokens):
            logits, _ = model(idx[:, -context:])  # (B, T, V); no KV cache
            logits = logits[:, -1, :].float() / temperature  # (B, V)
            if vocab_limit is not None:  # embedding rows no token has
                logits[:, vocab_limit:] = -math.inf
            if top_k is not None and top_k < logits.size(-1):
                top, where = torch.topk(logits, top_k, dim=-1)  # (B, k): exactly k ids survive
                logits = torch.full_like(logits, -math.inf).scatter(-1, where, top)
            probs = torch.softmax(logits, dim=-1)
            nxt = torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)
            idx = torch.cat([idx, nxt], dim=1)
    return idx


def sample_ids(
    model: GPT, rows: list[list[int]], opts: SampleOptions, device: torch.device, vocab_limit: int
) -> torch.Tensor:
    """``generate`` from ``rows`` (equal-length id lists) with ``opts``, seeded with ``opts.seed``
    on ``device``: the same inputs give the same ids. Returns (B, T0 + N) int64."""
    idx = torch.tensor(rows, dtype=torch.long, device=device)
    generator = torch.Generator(device=device).manual_seed(opts.seed)
    return generate(
        model, idx, opts.max_new_tokens, opts.temperature, opts.top_k, generator, vocab_limit
    )


def sample_texts(run: TrainedRun, prompt: str, opts: SampleOptions) -> list[str]:
    """``opts.num_samples`` texts, each ``decode(encode(prompt) + new ids)``, one seeded batch;
    raises ConfigError for a refused prompt (``encode_prompt``)."""
    ids = encode_prompt(run.tokenizer, prompt)
    start = ids or [int(i) for i in np.asarray(run.tokenizer.separator)]  # fed, not decoded
    out = sample_ids(run.model, [start] * opts.num_samples, opts, run.device, run.tokenizer.n_vocab)
    new = out[:, len(start) :].tolist()
    return [run.tokenizer.decode(ids + row) for row in new]
