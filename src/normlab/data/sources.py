"""The corpus as document streams: a dataset on the Hugging Face Hub (or a local folder laid out
like one) through ``datasets.load_dataset``, or local files (``normlab.data.corpus``).

Hub datasets use their own ``validation`` split when they have one; otherwise each document is
routed by the hash of its text (``corpus.held_out``). Before the Hub is touched, its reachability
(3 s) and ``HF_HUB_OFFLINE`` are checked: offline is one line saying what to do.

Why: docs/data.md
"""

from __future__ import annotations

import os
from pathlib import Path

from normlab.config import DataConfig, DataFormat
from normlab.data import tokenizer as tt
from normlab.data.corpus import (
    DataError,
    Stream,
    corpus_files,
    file_format,
    local_streams,
    package_version,
    relative_names,
    rows,
    split_by_tails,
    split_by_work,
)


def _where(cfg: DataConfig) -> str:
    return f"{cfg.hf_path}{f' ({cfg.hf_name})' if cfg.hf_name else ''}"


def _hub_unreachable(cfg: DataConfig, why: str) -> DataError:
    return DataError(
        f"data={cfg.name} needs {_where(cfg)} from the Hugging Face Hub, which is unreachable "
        f"({why}): run `normlab-prepare data={cfg.name}` (with the same data overrides) where the "
        "Hub is reachable and copy its token folder here (into $NORMLAB_CACHE, or point "
        "data.token_dir at it), or set HF_DATASETS_CACHE/HF_HOME to a cache that holds the "
        "dataset and use HF_HUB_OFFLINE=1 with data.streaming=false"
    )


def _hub_streams(cfg: DataConfig) -> list[Stream]:
    import datasets

    where = _where(cfg)
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
        lambda: rows(dd["train"], cfg.text_field, where),
        count("train"),
    )
    if val_name is None:
        return [train]
    return [
        train,
        Stream(val_name, "val", lambda: rows(dd[val_name], cfg.text_field, where), count(val_name)),
    ]


def open_streams(cfg: DataConfig) -> list[Stream]:
    """The corpus as document streams (this is where ``datasets`` and the network come in)."""
    return (
        _hub_streams(cfg) if cfg.format == DataFormat.hub else local_streams(cfg, corpus_files(cfg))
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


def source_info(cfg: DataConfig) -> dict:
    """What meta.json records about where the documents came from."""
    if cfg.format == DataFormat.hub:
        return {
            "hf_path": cfg.hf_path,
            "hf_name": cfg.hf_name,
            "revision": cfg.revision or "main",
            "text_field": cfg.text_field,
        }
    files = corpus_files(cfg)
    fmt = file_format(cfg, files)
    names = relative_names(files)
    info: dict = {
        "format": fmt,
        "path": str(files[0].parent if cfg.path is None or Path(cfg.path).is_dir() else files[0]),
        "files": [names[f] for f in files],
    }
    package = package_version(cfg)
    if package:
        info["package"] = package
    if fmt == "text" and split_by_tails(files, cfg.val_fraction):
        info["val_split"] = f"the last {cfg.val_fraction:g} of every file's characters"
    elif fmt == "text" and len(files) > 1:
        info["val_files"] = [names[f] for f in split_by_work(files, cfg.val_fraction)[1]]
    return info
