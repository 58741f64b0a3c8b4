"""``train``'s command line before Hydra runs: resume by path, output dirs, and the up-front check
of every override, so that a misspelled key or option is one line naming the fix (exit 2)."""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from enum import Enum
from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf

from normlab.commands.overrides import one_per_value, quote, value_of
from normlab.commands.schema_keys import (
    group_options,
    schema_keys,
    suggest_key,
    unknown_key,
    unknown_option,
)
from normlab.compose import compose_dict
from normlab.config import CliConfig, ConfigError

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
    """Refuse an output dir (``hydra.run.dir`` or ``hydra.sweep.dir``) that cannot be created and
    written. The part of ``template`` before its first ``${`` is checked: its nearest existing
    ancestor must be a writable folder (a temporary file is created and removed there) with at
    least :data:`MIN_FREE_BYTES` free.

    Raises:
        ConfigError: one line naming the key, the folder and the reason.
    """
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
        raise ConfigError(f"{key}={template} is not writable: {probe}: {e.strerror or e}") from None
    free = shutil.disk_usage(probe).free
    if free < MIN_FREE_BYTES:
        raise ConfigError(
            f"{key}={template} has no room: {free / 2**20:.0f} MiB free in {probe} "
            f"(at least {MIN_FREE_BYTES >> 20} MiB needed)"
        )


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


def _resume_by_path(args: list[str], resume: str, multirun: bool) -> list[str]:
    """``resume=<run dir>``: the run's original overrides first, the typed ones after (later
    wins), then ``hydra.run.dir``; the path made absolute (a job may change into its run dir)."""
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
    original = (yaml.safe_load(record.read_text()) or []) if record.is_file() else []
    keep = [
        o for o in original if value_of([o], "resume") is None and value_of([o], "force") is None
    ]
    typed = [as_override("resume", str(run_dir)) if value_of([a], "resume") else a for a in args]
    return [*keep, *typed, as_override("hydra.run.dir", str(run_dir))]


def prepare_args(args: list[str], conf_dir: Path) -> list[str]:
    """The command line Hydra gets: ``resume=<run dir>`` expanded, output dirs checked.

    When the run dir of a single run already holds a ``.hydra/`` record (a resume, or
    ``hydra.run.dir=<dir> resume=auto`` again), ``hydra.output_subdir=null`` keeps Hydra from
    overwriting it: it stays the record of the run's first invocation.

    Raises:
        ConfigError: a resume path that is not a run dir, resume by path in a multirun, a
            launcher whose plugin is missing, or an output dir that cannot be written.
    """
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
        args = _resume_by_path(args, resume, multirun)
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


def _check_value(key: str, default: Any, values: list[Any]) -> None:
    """Refuse a value that is no member of a closed choice, or not of the key's type."""
    for v in values:
        if isinstance(default, Enum) and isinstance(v, str) and "${" not in v:
            members = list(type(default).__members__)
            if v not in members:
                hint = suggest_key(v, members)
                fix = f"; did you mean {key}={hint}?" if hint and " or " not in hint else ""
                raise ConfigError(f"{key}={v} is not allowed (allowed: {', '.join(members)}){fix}")
    node = OmegaConf.structured(CliConfig)
    for v in values:
        try:
            OmegaConf.update(node, key, v, merge=True)
        except Exception as e:  # OmegaConf's ValidationError: a value of the wrong type
            raise ConfigError(f"{key}={v}: {one_line(e)}") from None


def check_overrides(args: list[str], conf_dir: Path) -> None:
    """Refuse, before Hydra runs, an override naming no key or group option of the config, or a
    value of the wrong type, with the closest name; then compose once per swept group option so
    that any other composition error is one line too. ``hydra.*`` keys are left to Hydra.

    Raises:
        ConfigError: one line naming the override and, where one is close, the fix.
    """
    if any(a.startswith("-") and a not in ("-m", "--multirun", "-r", "--run") for a in args):
        return  # --config-name and friends compose another config: Hydra checks that one
    overrides = [a for a in args if not a.startswith("-")]
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
    plain = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    for job in one_per_value(plain, vary=lambda k: k in groups):
        try:
            compose_dict(job)
        except Exception as e:  # Hydra's and OmegaConf's composition errors
            raise ConfigError(one_line(e)) from None


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
