"""Every ``conf/experiment/*.yaml`` file, checked the way it is used (lightning-hydra-template's
"run every experiment" test):

- every file composes and validates as ``train`` composes it (GPU files with ``device=cpu`` too);
- every file trained by ``train`` on a CPU runs through the real CLI, shrunk to a few steps of the
  tiny model, its sweep cut to its first values (two jobs where it sweeps), and every job completes
  with the experiment's own settings (its sweep dir names, its wandb group, its diagnostics);
- the files that need a GPU (``*_gpu``, ``loss_parity``) and the studies run by their own scripts
  (``fp16_statistics``, ``norm_cost``: ``scripts/*.sh``) compose and validate only.
"""

from __future__ import annotations

import json

import pytest
import yaml

from normlab.compose import compose_cli
from normlab.report.variants import GLOBAL_GROUPS

from ..conftest import CONF_DIR, TINY

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
#: Studies run by scripts/<name>.sh through their own command, not by `train`.
SCRIPT_STUDIES = {"fp16_statistics", "norm_cost"}


def experiment_file(name: str) -> dict:
    return yaml.safe_load((CONF_DIR / "experiment" / f"{name}.yaml").read_text())


def needs_gpu_or_hub(name: str) -> bool:
    """Sized for a GPU (``*_gpu``, device=cuda) or reading a Hub corpus (the FineWeb-Edu
    recipes): composed and validated here, never trained on this CPU. Read from the file and its
    data group's file (collection time: composing every file in every worker took seconds);
    :func:`test_the_classification_is_what_the_composed_config_says` holds it to composition."""
    file = experiment_file(name)
    data = [d["override /data"] for d in file.get("defaults", []) if "override /data" in d]
    hub = [yaml.safe_load((CONF_DIR / "data" / f"{d}.yaml").read_text())["format"] for d in data]
    return name.endswith("_gpu") or str(file.get("device")).startswith("cuda") or "hub" in hub


GPU = {name for name in EXPERIMENTS if needs_gpu_or_hub(name)}
TRAINED_ON_CPU = [n for n in EXPERIMENTS if n not in GPU and n not in SCRIPT_STUDIES]
#: TINY with 2 steps (logger=none: wandb is covered by test_cli), one evaluation.
SHRINK = [o for o in TINY if not o.startswith(("max_steps", "eval_interval"))]
SHRINK += ["max_steps=2", "eval_interval=2"]
#: A warm-up/stable/decay file keeps its schedule and cool-down branches: 8 steps, 1 of warm-up
#: (at 2 steps its decay would start inside the warm-up and a 0.5 branch would be 1 step).
SHRINK_WSD = [*SHRINK[:-2], "max_steps=8", "eval_interval=4", "optim.warmup_steps=1"]


def shrink(name: str) -> tuple[list[str], int]:
    """The overrides that shrink experiment ``name`` to a few steps of the tiny model, and the
    steps it then trains."""
    wsd = compose_cli([f"experiment={name}"]).optim.schedule.name == "wsd"
    return (SHRINK_WSD, 8) if wsd else (SHRINK, 2)


def test_the_classification_covers_every_experiment_file():
    assert set(TRAINED_ON_CPU) | GPU | SCRIPT_STUDIES == set(EXPERIMENTS)
    assert "quickstart" in TRAINED_ON_CPU and "loss_parity_cpu" in TRAINED_ON_CPU
    assert {"loss_parity", "loss_parity_1h"} <= GPU


def test_the_classification_is_what_the_composed_config_says():
    for name in EXPERIMENTS:
        cfg = compose_cli([f"experiment={name}"])
        composed = cfg.device.startswith("cuda") or cfg.data.format.name == "hub"
        assert needs_gpu_or_hub(name) == (name.endswith("_gpu") or composed), name


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes_and_validates_as_train_composes_it(name):
    full = compose_cli([f"experiment={name}"])
    file = experiment_file(name)
    assert full.max_steps == file.get("max_steps", full.max_steps)
    assert full.logger.group == file.get("logger", {}).get("group", full.logger.group)
    if name in GPU:  # the same file on a CPU: only the device differs
        on_cpu = compose_cli([f"experiment={name}", "device=cpu"])
        assert on_cpu.device == "cpu" and on_cpu.model == full.model and on_cpu.norm == full.norm


def cut_sweep(name: str) -> list[str]:
    """Overrides that cut the experiment's sweep to its first value per key; the first swept
    key keeps two values, so a sweep still makes two jobs with two dir names."""
    params = experiment_file(name).get("hydra", {}).get("sweeper", {}).get("params", {})
    if not params:
        return []
    kept = []
    for i, (key, values) in enumerate(params.items()):
        first = str(values).split(",")[: 2 if i == 0 else 1]
        kept.append(f"{key}:'{','.join(first)}'")
    return ["hydra.sweeper.params={" + ",".join(kept) + "}"]


@pytest.mark.slow
@pytest.mark.parametrize("name", TRAINED_ON_CPU)
def test_every_cpu_experiment_trains_through_the_real_cli_shrunk(tmp_path, name, train_main):
    file = experiment_file(name)
    multirun = file.get("hydra", {}).get("mode") == "MULTIRUN"
    out = tmp_path / "out"
    where = f"hydra.sweep.dir={out}" if multirun else f"hydra.run.dir={out}"
    # torch.compile of the norm costs minutes on a shared CPU: the compiled path has its own tests
    compiled = compose_cli([f"experiment={name}"]).norm.impl.name == "compiled"
    overrides, steps = shrink(name)
    args = [f"experiment={name}", *overrides, *cut_sweep(name), where, "threads=1"]
    code, _, err = train_main([*args, *(["norm.impl=torch"] if compiled else [])], tmp_path)
    assert code == 0, err[-2000:]
    jobs = sorted(p.parent for p in out.rglob("summary.json"))
    assert len(jobs) == (2 if multirun else 1)
    for job in jobs:
        summary = json.loads((job / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["steps_completed"] == steps
        config = summary["config"]
        assert config["logger"]["group"] == file.get("logger", {}).get("group")
        assert config["diag_interval"] == file.get("diag_interval")
        assert config["model"]["name"] == "tiny" and config["max_steps"] == steps
    if multirun:  # job i got the i-th value of the first swept key, and its dir name says so
        key, values = next(iter(file["hydra"]["sweeper"]["params"].items()))
        for job, value in zip(jobs, str(values).split(",")[:2], strict=True):
            if (
                key in GLOBAL_GROUPS
            ):  # a recipe group (design=...): in the overrides, not the config
                assert f"{key}={value}" in (job / ".hydra" / "overrides.yaml").read_text()
                assert value in job.name, (job.name, value)
                continue
            config = json.loads((job / "summary.json").read_text())["config"]
            node = config
            for part in key.split("."):
                node = node[part]
            got = node["kind"] if key == "norm" else node
            want = yaml.safe_load(value)  # "null": no value, so nothing of it in the dir name
            assert got == want, (job.name, key, value)
            assert want is None or str(want).replace("/", "+") in job.name, (job.name, value)
