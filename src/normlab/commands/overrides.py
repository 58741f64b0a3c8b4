"""``train``'s command line before Hydra runs: Hydra's override grammar (sweeps expanded, values
quoted), resume by path, output dirs, and the up-front check of every override (names against
``keys``, values against the schema's types) and of what the machine lacks, so that a misspelled
key or option, a value out of range in any job of a sweep or a GPU recipe without a GPU is one
line naming the fix (exit 2) before any job runs. Torch only to ask for a GPU and its memory.
``normlab-prepare`` expands its sweeps here too.

Why: docs/running.md
"""

from __future__ import annotations

import dataclasses
import errno
import importlib.metadata
import importlib.util
import itertools
import os
import re
import shutil
import socket
import sys
import tempfile
import types
import typing
import urllib.parse
from collections.abc import Callable
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf

from normlab import config
from normlab.commands.keys import (
    group_options,
    schema_keys,
    shown,
    suggest_key,
    unknown_key,
    unknown_option,
)
from normlab.compose import compose_dict, validate
from normlab.config import CliConfig, ConfigError
from normlab.config.files import load_yaml

# --- Hydra's override grammar


def expand(overrides: list[str]) -> list[list[str]]:
    """Comma lists and ``range``/``choice`` sweeps -> one override list per combination, in Hydra's
    BasicSweeper's order (a slot per key as it first appears, the last varying fastest). Hydra's
    OverrideParseException for a line its grammar rejects, HydraException for an ``interval``."""
    slots: dict[str, list[str]] = {}
    for o in OverridesParser.create().parse_overrides(overrides):
        key = o.get_key_element()
        if o.is_sweep_override():
            if not o.is_discrete_sweep():
                raise HydraException(f"{o.input_line}: a {o.value_type.name} cannot be expanded")
            slots[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
        else:
            slots[key] = [f"{key}={o.get_value_element_as_str()}"]
    return [list(job) for job in itertools.product(*slots.values())]


def one_per_value(overrides: list[str], vary: Callable[[str], bool]) -> list[list[str]]:
    """Override lists that together use every value of each sweep whose key ``vary`` accepts: the
    first list holds every sweep's first value; each further list changes one of those sweeps to
    one of its other values. ``1 + sum(len(values) - 1)`` lists, not the product.
    """
    slots: dict[str, list[str]] = {}
    for o in OverridesParser.create().parse_overrides(overrides):
        key = o.get_key_element()
        if o.is_sweep_override() and o.is_discrete_sweep():
            values = [f"{key}={v}" for v in o.sweep_string_iterator()]
            slots[key] = values if vary(o.key_or_group) else values[:1]
        else:
            slots[key] = [o.input_line]
    first = [values[0] for values in slots.values()]
    jobs = [first]
    for i, values in enumerate(slots.values()):
        jobs += [[*first[:i], v, *first[i + 1 :]] for v in values[1:]]
    return jobs


def quote(value: str) -> str:
    """``value`` as a single-quoted string of Hydra's grammar (a path holding ``=``, ``,`` or
    spaces). Quotes are escaped; backslashes only where they precede a quote or the end."""
    body = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value)
    return f"'{body}'"


def value_of(args: list[str], key: str) -> str | None:
    """The value of the last ``key=value`` override in ``args`` (None if absent), unquoted by
    Hydra's grammar when it parses; else the raw text after the first ``=`` (``resume=a=b``)."""
    found = None
    for a in args:
        if "=" not in a or a.lstrip("+~").split("=", 1)[0] != key:
            continue
        try:
            parsed = OverridesParser.create().parse_override(a)
            found = None if parsed.is_sweep_override() else parsed.value()
            found = a.split("=", 1)[1] if found is None or not isinstance(found, str) else found
        except HydraException:
            found = a.split("=", 1)[1]
    return found


# --- the command line before Hydra


#: Hydra flags that only print something; they need no writable output dir.
INFO_FLAGS = {
    "--help",
    "-h",
    "--hydra-help",
    "--version",
    "--cfg",
    "-c",
    "--info",
    "-i",
    "--shell-completion",
    "-sc",
    "--resolve",
}
#: Less free space than this in the output dir is reported as a full disk before anything runs.
MIN_FREE_BYTES = 64 << 20


def check_output_dir(key: str, template: str) -> None:
    """Refuse (one line, ConfigError) an output dir whose ``template`` before its first ``${`` has
    no writable folder as its nearest existing ancestor (a temporary file is made and removed
    there) with ``MIN_FREE_BYTES`` free."""
    target = Path(template.split("${", 1)[0] or ".").expanduser()
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"{key}={template} cannot be created: {probe} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise ConfigError(f"{key}={template} is not writable: {probe}: {e.strerror}") from None
        fs = filesystem_type(probe)
        why = f"a {fs} filesystem" if fs else (e.strerror or str(e))
        raise ConfigError(
            f"{key}={template} cannot be created: {probe} accepts no new files ({why})"
        ) from None
    free = shutil.disk_usage(probe).free
    if free < MIN_FREE_BYTES:
        raise ConfigError(
            f"{key}={template} has no room: {free / 2**20:.0f} MiB free in {probe} "
            f"(at least {MIN_FREE_BYTES >> 20} MiB needed)"
        )


def filesystem_type(path: Path) -> str | None:
    """The type of the filesystem ``path`` is on (``ext4``, ``proc``, ``tmpfs``), from
    ``/proc/mounts`` (the longest mount point above it); None where that file is not readable."""
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return None
    path = path.resolve()
    above = [(Path(m), fs) for m, fs in mounts if path == Path(m) or Path(m) in path.parents]
    return max(above, key=lambda mf: len(mf[0].parts))[1] if above else None


def as_override(key: str, value: str) -> str:
    """``key=value`` in Hydra's grammar: quoted when the bare value would not parse as itself
    (a path holding ``=``, ``,``, spaces or quotes, like ``ckpt/epoch=3-step=100``)."""
    bare = f"{key}={value}"
    try:
        if OverridesParser.create().parse_override(bare).value() == value:
            return bare
    except HydraException:
        pass
    return f"{key}={quote(value)}"


def launch_rank() -> int:
    """This process's rank as torchrun set it (``RANK``; 0 without torchrun), read before torch."""
    return int(os.environ.get("RANK", "0"))


def replayable(override: str, conf_dir: Path) -> bool:
    """Whether ``resume=<run dir>`` replays ``override`` from the run's ``.hydra/overrides.yaml``:
    a key or group of the schema only, never ``resume``, ``force``, ``hydra`` or anything naming a
    ``_target_`` (which Hydra would import and call: a run dir is data, not code)."""
    key = override.split("=", 1)[0].lstrip("+~")
    if key in ("resume", "force") or key.startswith("hydra") or "_target_" in override:
        return False
    names = {k.name for k in schema_keys(conf_dir)}
    groups = {g for g in group_options(conf_dir) if not g.startswith("hydra")}
    return key in names or key in groups or any(n.startswith(key + ".") for n in names)


def _resume_by_path(args: list[str], resume: str, multirun: bool, conf_dir: Path) -> list[str]:
    """``resume=<run dir>``: the run's original overrides first (the schema's keys only:
    ``replayable``; the others are named on stderr), the typed ones after (later wins), then
    ``hydra.run.dir``; the path made absolute (a job may change into its run dir)."""
    run_dir = Path(resume).expanduser().absolute()
    if multirun:
        raise ConfigError(
            f"resume={resume} resumes one run; "
            "to continue a sweep use hydra.sweep.dir=<sweep dir> resume=auto"
        )
    if not (run_dir / "checkpoints").is_dir():
        raise ConfigError(
            f"resume={resume} is not a run dir with checkpoints "
            f"({run_dir / 'checkpoints'} does not exist)"
        )
    record = run_dir / ".hydra" / "overrides.yaml"
    try:  # within limits, no alias (normlab.config.files): a run dir is not trusted
        original = (load_yaml(record) or []) if record.is_file() else []
    except (OSError, ValueError, yaml.YAMLError) as e:  # RunFileError is a ValueError
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"resume={resume}: cannot read {record}: {first}") from None
    if not isinstance(original, list):
        raise ConfigError(f"resume={resume}: {record} is not a list of overrides")
    keep = [str(o) for o in original if replayable(str(o), conf_dir)]
    if dropped := [str(o) for o in original if not replayable(str(o), conf_dir)]:
        if launch_rank() == 0:
            print(
                f"normlab: resume: not replayed from {record} (only keys of the schema are): "
                + " ".join(dropped),
                file=sys.stderr,
            )
    typed = [as_override("resume", str(run_dir)) if value_of([a], "resume") else a for a in args]
    return [*keep, *typed, as_override("hydra.run.dir", str(run_dir))]


def prepare_args(args: list[str], conf_dir: Path) -> list[str]:
    """The command line Hydra gets: ``resume=<run dir>`` expanded, output dirs checked, an existing
    ``.hydra/`` record kept as the first invocation's (``hydra.output_subdir=null``). ConfigError:
    a bad resume path, resume by path in a multirun, a missing launcher plugin, a dir unwritable."""
    if any(a.split("=", 1)[0] in INFO_FLAGS for a in args):
        return args
    launcher = value_of(args, "hydra/launcher") or ""
    if launcher.startswith("submitit") and not importlib.util.find_spec(
        "hydra_plugins.hydra_submitit_launcher"
    ):
        raise ConfigError(
            f"hydra/launcher={launcher} needs the hydra-submitit-launcher plugin: "
            "pip install 'normlab[slurm]'"
        )
    multirun = "-m" in args or "--multirun" in args
    resume = value_of(args, "resume")
    if resume not in (None, "null", "auto"):
        args = _resume_by_path(args, resume, multirun, conf_dir)
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    run_dir = value_of(args, "hydra.run.dir")
    if not multirun and run_dir and (Path(run_dir).expanduser() / ".hydra").is_dir():
        args = [*args, "hydra.output_subdir=null"]  # keep the record of the run's first invocation
    template = value_of(args, key)
    if template is None:  # the default in train.yaml, read unresolved (${now:...} needs Hydra)
        node: Any = yaml.safe_load((conf_dir / "train.yaml").read_text())
        for part in key.split("."):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        template = node if isinstance(node, str) else "."
    check_output_dir(key, template)
    return args


def one_line(e: BaseException) -> str:
    """A Hydra or OmegaConf error as one line: its first line and its cause's, joined."""
    parts: list[str] = []
    cause: BaseException | None = e
    while cause is not None and len(parts) < 2:
        first = str(cause).strip().splitlines()[0].strip() if str(cause).strip() else ""
        if first and "$VALUE" not in first and first not in parts:
            parts.append(first.rstrip("."))
        cause = cause.__cause__ or cause.__context__
    return ": ".join(parts) or type(e).__name__


#: The largest value of an int key: torch and numpy keep ints in 64 bits.
INT64_MAX = 2**63 - 1


@cache
def leaf_types() -> dict[str, tuple[Any, ...]]:
    """``dotted key -> the types its annotation allows`` (``bool | None`` -> ``(bool,
    NoneType)``) for every leaf of ``CliConfig`` annotated with plain types (lists and
    ``Any`` left out); a ``norm.positions.<position>`` key takes its ``norm`` key's types or null.
    """
    out: dict[str, tuple[Any, ...]] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        if cls is config.NormOverride:  # each mirrors the NormConfig key of its name
            hints = {k: v | None for k, v in typing.get_type_hints(config.NormConfig).items()}
        for f in dataclasses.fields(cls):
            hint = hints.get(f.name)
            if dataclasses.is_dataclass(hint):
                walk(hint, f"{prefix}{f.name}.")
                continue
            union = typing.get_origin(hint) in (typing.Union, types.UnionType)
            args = typing.get_args(hint) if union else (hint,)
            if all(isinstance(a, type) and a is not Any for a in args):
                out[prefix + f.name] = args

    walk(config.CliConfig, "")
    return out


def _check_type(key: str, values: list[Any]) -> None:
    """Refuse a value OmegaConf would coerce or torch cannot hold: a bool key takes ``true`` or
    ``false`` only (OmegaConf turns 2 or ``yes`` into true), an int key at most ``INT64_MAX``
    in size. Keys from ``leaf_types``: a new key of the schema is covered as it is added."""
    allowed = leaf_types().get(key, ())
    nullable = type(None) in allowed
    for v in values:
        if v is None and nullable or isinstance(v, str) and "${" in v:
            continue
        if bool in allowed and int not in allowed and float not in allowed:
            if not (isinstance(v, bool) or str(v).lower() in ("true", "false")):
                also = " (or null)" if nullable else ""
                raise ConfigError(f"{key}={shown(v)} is not allowed: true or false{also}")
        elif int in allowed and isinstance(v, int) and abs(v) > INT64_MAX:
            raise ConfigError(f"{key}={v} is not allowed: a 64-bit integer (at most {INT64_MAX})")


def _check_value(key: str, default: Any, values: list[Any]) -> None:
    """Refuse a value that is no member of a closed choice, or not of the key's type
    (``_check_type``). A ``norm.positions.<position>`` key takes the type of the ``norm`` key
    of its name, or null (``NormOverride`` types its fields ``Any``)."""
    _check_type(key, values)
    enums = [t for t in leaf_types().get(key, ()) if isinstance(t, type) and issubclass(t, Enum)]
    choice = type(default) if isinstance(default, Enum) else next(iter(enums), None)
    for v in values:
        if choice is not None and isinstance(v, str) and "${" not in v:
            members = list(choice.__members__)
            if v not in members:
                hint = suggest_key(v, members)
                fix = f"; did you mean {key}={hint}?" if hint and " or " not in hint else ""
                raise ConfigError(f"{key}={v} is not allowed (allowed: {', '.join(members)}){fix}")
    node, path = OmegaConf.structured(CliConfig), key
    if key.startswith("norm.positions."):
        node, path = OmegaConf.structured(config.NormConfig), key.rsplit(".", 1)[1]
    for v in values:
        if v is None and path != key:
            continue  # a position's null: the norm key's value
        try:
            OmegaConf.update(node, path, v, merge=True)
        except Exception as e:  # OmegaConf's ValidationError: a value of the wrong type
            raise ConfigError(f"{key}={v}: {one_line(e)}") from None


def hub_unreachable() -> str | None:
    """Why the Hugging Face Hub cannot be reached from here (``HF_HUB_OFFLINE`` /
    ``HF_DATASETS_OFFLINE`` set, or no connection to its host within 5 s); None when it can."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").lower() in ("1", "true", "yes", "on"):
            return f"{var}={os.environ[var]} is set"
    host = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((host.hostname, host.port or 443), timeout=5).close()
    except OSError as e:
        return f"no connection to {host.hostname}: {e.strerror or e}"
    return None


#: The memory rule's bytes: a parameter trains in 16 (fp32 weight, gradient, AdamW's two
#: moments), an activation kept for the backward pass in at least 2 (bf16), and each step and
#: validation batch keeps at least 8 (its step time, its loss).
PARAM_BYTES, ACTIVATION_BYTES, RECORD_BYTES = 16, 2, 8
MEMORY_RULE = (
    f"{PARAM_BYTES} bytes a parameter (weight, gradient, AdamW's two moments) + "
    f"{ACTIVATION_BYTES} bytes a value of one micro-batch's activations (data.batch_size x "
    "model.context_length x (model.n_layer x model.d_model + vocabulary)) + "
    f"{RECORD_BYTES} bytes a step and a validation batch must fit in the memory it trains in"
)


def gate_params(full: CliConfig) -> int:
    """The parameters of the norms' gates (GatedNorm: W_down (r, d) and W_up (d, r)) of the
    model of ``full``, one norm per position and block (a lower bound: qk has 2 or 3), counted
    per run of blocks that share their norms (Mix-LN's post blocks, ``norm.blocks`` entries)."""
    norm, m = full.norm, full.model
    L, C = m.n_layer, m.d_model
    per_head = norm.qk == config.QKNorm.head or norm.placement == config.Placement.hybrid
    qk_size = C // m.n_head if per_head else C
    edges = {0, L, norm.post_blocks(L)} | {e.start for e in norm.schedule}
    edges |= {e.stop + 1 for e in norm.schedule}
    cuts = sorted(e for e in edges if 0 <= e <= L)
    total = 0
    for a, b in zip(cuts, cuts[1:], strict=False):
        for pos in norm.block_positions(a, L):
            rank = norm.at(pos, a).resolved_gate_rank or 0
            total += (b - a) * 2 * rank * (qk_size if pos == "qk" else C)
    for pos in {"embedding", "final"} & set(norm.used_positions()):
        total += 2 * (norm.at(pos).resolved_gate_rank or 0) * C
    return total


def memory_parts(full: CliConfig) -> list[tuple[str, int]]:
    """A lower bound of the memory a run of ``full`` trains in (``MEMORY_RULE``), in parts:
    ``(the keys that size it, with their values; bytes)``. The vocabulary is at least 256."""
    m, n, B = full.model, full.norm, full.data.batch_size
    L, C, T, V = m.n_layer, m.d_model, m.context_length, m.vocab_size or 256
    vocab = f"model.vocab_size={m.vocab_size}" if m.vocab_size else "the vocabulary (>= 256)"
    rank = max((c.resolved_gate_rank or 0, w) for w, c in n.derived())
    gates = f"{rank[1]}.gate_rank={rank[0]}".replace("norm.blocks=", "gate_rank of norm.blocks=")
    shape = f"model.n_layer={L}, model.d_model={C}"
    return [
        (f"{vocab}, model.d_model={C}", PARAM_BYTES * V * C * (1 if m.tie_head else 2)),
        (f"model.context_length={T}, model.d_model={C}", PARAM_BYTES * T * C),
        (shape, PARAM_BYTES * 12 * L * C * C),  # attention 4 C^2, MLP 8 C^2 a block
        (f"{gates}, model.d_model={C}", PARAM_BYTES * gate_params(full)),
        (
            f"data.batch_size={B}, model.context_length={T}, {shape}, {vocab}",
            ACTIVATION_BYTES * B * T * (L * C + V),
        ),
        (
            f"max_steps={full.max_steps}, eval_batches={full.eval_batches}",
            RECORD_BYTES * (full.max_steps + full.eval_batches * (1 + len(full.eval_data))),
        ),
    ]


def memory_limit(device: str) -> tuple[int, str]:
    """The memory a run on ``device`` trains in, and its name: the GPU's for ``cuda``/``cuda:N``
    (when that GPU is here), else this machine's physical memory."""
    if device.startswith("cuda"):
        import torch

        index = int(device.split(":")[1]) if ":" in device else 0
        if torch.cuda.is_available() and index < torch.cuda.device_count():
            return torch.cuda.get_device_properties(index).total_memory, f"GPU {index}'s memory"
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return pages, "this machine's physical memory"


def _size(n: int) -> str:
    units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]
    i = min(max(0, (n.bit_length() - 1) // 10), len(units) - 1)
    return f"{n / 2 ** (10 * i):.3g} {units[i]}"


def check_memory(full: CliConfig) -> None:
    """Refuse (one line, ConfigError: the values, the bytes needed and there, the rule) a run whose
    lower bound of memory (``memory_parts``) exceeds what it trains in (``memory_limit``)."""
    parts = memory_parts(full)
    need = sum(b for _, b in parts)
    limit, where = memory_limit(str(full.device))
    if need <= limit:
        return
    keys, most = max(parts, key=lambda p: p[1])
    raise ConfigError(
        f"{keys}: a run needs at least {_size(need)} of memory ({_size(most)} of it for these "
        "values, its largest part), "
        f"more than {where} ({_size(limit)}); the rule: {MEMORY_RULE}"
    )


class NeedsGpu(ConfigError):
    """A config that needs a CUDA GPU on a machine without one: ``need`` says so, ``instead``
    what to run here (``check_overrides`` names the experiment's CPU study)."""

    def __init__(
        self, need: str, instead: str = "choose a CPU experiment (train --help lists them)"
    ):
        super().__init__(f"{need}: run it on a GPU machine, or {instead}")
        self.need = need


def torch_without_cuda() -> str | None:
    """torch's version when its wheel is a CPU build (``2.13.0+cpu``), read from its package
    metadata without importing torch; None otherwise (a CUDA build, or torch not installed)."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    return version if version.endswith("+cpu") else None


def cpu_twin(experiment: str, conf_dir: Path) -> str | None:
    """The CPU study that asks a GPU recipe's question: ``<name>_cpu`` or ``<name>`` for
    ``<name>_gpu`` or ``<name>``, dropping trailing ``_<part>`` until one sets no ``device: cuda``
    (``ladder_gpu`` -> ``ladder_cpu``, ``loss_parity_1h`` -> ``loss_parity_cpu``); else None."""
    parts = experiment.removesuffix("_gpu").split("_")
    for n in range(len(parts), 0, -1):
        for name in (f"{'_'.join(parts[:n])}_cpu", "_".join(parts[:n])):
            path = conf_dir / "experiment" / f"{name}.yaml"
            if name != experiment and path.is_file():
                device = (yaml.safe_load(path.read_text()) or {}).get("device")
                if not str(device).startswith("cuda"):
                    return name
    return None


def check_needs(full: CliConfig) -> None:
    """Refuse (one line, ConfigError) a config that needs what this machine lacks: a CUDA GPU
    (``NeedsGpu``; a CPU build of torch is known without importing it), more memory
    (``check_memory``), or the Hub for a Hub corpus not prepared here while it is unreachable."""
    if str(full.device).startswith("cuda"):
        cpu_build = torch_without_cuda()
        if cpu_build:
            why = f"torch {cpu_build}, CUDA not built in"
        else:
            import torch

            why = f"torch {torch.__version__}, CUDA {torch.version.cuda or 'not built in'}"
        if cpu_build or not torch.cuda.is_available():
            need = f"device={full.device} needs a CUDA GPU and this machine has none ({why})"
            raise NeedsGpu(need)
    check_memory(full)
    data = full.data
    if data.format.name != "hub" or (data.hf_path and Path(data.hf_path).expanduser().exists()):
        return
    from normlab.data.shards import META
    from normlab.data.tokens import token_dir

    tokens = token_dir(data)
    if not (tokens / META).is_file() and (why := hub_unreachable()):
        raise ConfigError(
            f"data={data.name} is read from the Hugging Face Hub ({data.hf_path}) and its tokens "
            f"are not prepared in {tokens}, but the Hub cannot be reached ({why}): prepare them "
            f"where it can (normlab-prepare data={data.name} with the same overrides; with "
            "HF_DATASETS_CACHE shared), or choose a local corpus"
        )


def check_overrides(args: list[str], conf_dir: Path) -> None:
    """Refuse (one line, ConfigError, with the closest name) before Hydra runs: a key, option or
    value type the config lacks (``check_names``), then per job of ``one_per_value`` a composition
    error, a value out of range or an unmet need (``check_jobs``); ``--cfg`` checks names only."""
    overrides, flags = hydra_flags(args)
    if flags - {"-m", "--multirun", "-r", "--run"} - SHOW_FLAGS:
        return  # --config-name and friends compose another config: Hydra checks that one
    check_names(overrides, conf_dir)
    if not flags & SHOW_FLAGS:  # --cfg job prints the config: nothing runs, nothing is needed
        check_jobs(overrides, conf_dir)


def check_names(overrides: list[str], conf_dir: Path) -> None:
    """Refuse an override naming no key or group option of the config, or a value of the wrong
    type or outside a closed choice, in one line with the closest name; ``hydra.*`` is Hydra's."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        raise ConfigError(
            f"{one_line(e)} (a value holding '=', ',' or spaces needs quotes: key='a=b')"
        ) from None
    keys = {k.name: k for k in schema_keys(conf_dir)}
    groups = group_options(conf_dir)
    for o in parsed:
        key = o.key_or_group
        if key.startswith("hydra") or o.is_delete():
            continue
        sweep = o.is_sweep_override() and o.is_discrete_sweep()
        values = list(o.sweep_iterator()) if sweep else [o.value()]
        if key in groups:
            for v in values:
                if v is not None and str(v) not in groups[key]:
                    raise ConfigError(unknown_option(key, str(v), groups[key]))
        elif key in keys:
            _check_value(key, keys[key].default, values)
        elif not any(k.startswith(key + ".") for k in keys):
            raise ConfigError(unknown_key(key, o.input_line.split("=", 1)[-1], conf_dir))


def check_jobs(overrides: list[str], conf_dir: Path) -> None:
    """Compose and validate once per value of every sweep (``-m norm.eps=1e-5,0``) and
    ``check_needs`` each job: one line before job 0; a GPU recipe's names its CPU study."""
    plain = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    for job in one_per_value(plain, vary=lambda k: True):
        try:
            cfg = compose_dict(job)
        except Exception as e:  # Hydra's and OmegaConf's composition errors
            raise ConfigError(one_line(e)) from None
        try:
            check_needs(validate(cfg))
        except NeedsGpu as e:
            experiment = value_of(job, "experiment")
            if twin := experiment and cpu_twin(experiment, conf_dir):
                raise NeedsGpu(e.need, f"run its CPU study here: experiment={twin}") from None
            raise


#: Hydra's flags that take a value (``--cfg job``), and ``--info``'s optional one.
VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn"}
VALUE_FLAGS |= {"--config-dir", "-cd", "--experimental-rerun"}
INFO_CHOICES = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}
#: Flags that print the config instead of running it.
SHOW_FLAGS = {"--cfg", "-c", "--info", "-i", "--resolve", "--package", "-p"}


def hydra_flags(args: list[str]) -> tuple[list[str], set[str]]:
    """``(overrides, flags)`` of a command line: ``--cfg job norm=rsm`` -> ``(["norm=rsm"],
    {"--cfg"})``; a flag's value (``job``) is neither."""
    overrides, flags, skip = [], set(), False
    for i, a in enumerate(args):
        if skip:
            skip = False
        elif a.startswith("-"):
            name = a.split("=", 1)[0]
            flags.add(name)
            following = args[i + 1] if i + 1 < len(args) else None
            if "=" not in a and following is not None:
                skip = name in VALUE_FLAGS or name in ("--info", "-i") and following in INFO_CHOICES
        else:
            overrides.append(a)
    return overrides, flags


#: Where ``train`` leaves the keys a multirun sweeps, for its jobs (in this process or another).
SWEPT_ENV = "NORMLAB_SWEPT_KEYS"


def swept_keys(args: list[str]) -> list[str]:
    """The keys (or groups) that a multirun command line sweeps (``norm=layer,rms`` ->
    ``norm``); none for a single run or a line that does not parse (Hydra says why)."""
    if "-m" not in args and "--multirun" not in args:
        return []
    try:
        parsed = OverridesParser.create().parse_overrides([a for a in args if not a[:1] == "-"])
    except HydraException:
        return []
    return [o.key_or_group for o in parsed if o.is_sweep_override()]


def job_swept(task_overrides: list[str], keys: list[str]) -> tuple[str, ...]:
    """This job's ``key=value`` of the swept ``keys``, from its overrides (``hydra.overrides.task``:
    in a multirun, the job's own values)."""
    return tuple(o for o in task_overrides if o.split("=", 1)[0].lstrip("+~") in keys)
