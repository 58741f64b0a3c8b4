"""Every headline in docs/results re-derives: a report stored with its runs' series file
(``series.json.gz`` beside ``report.md``) is rebuilt from that file alone and its headline sections
must read as committed; a report stored without one is marked "not re-derivable" in its day's
``index.md``. A new report is covered with no edit here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from normlab.commands.report import main
from normlab.report.runs import SERIES_FILE

from .test_report import make_sweep

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
SERIES = sorted(RESULTS.rglob(SERIES_FILE))
#: What a day's index says of a report stored without its series.
NOT_REDERIVABLE = "not re-derivable"
#: The ``## `` sections compared: the headline numbers of a report and of a ladder report.
HEADLINES = re.compile(
    r"## (Compute-equivalent verdict|Final validation loss per variant|Paired difference|"
    r"Anytime-valid verdict|"
    r"Speed verdict|Sizes|Trend of|Final validation loss against training compute|"
    r"`[^`]+` vs `[^`]+` at each size)"
)


def headline_sections(md: str) -> dict[str, str]:
    """Heading -> text of each :data:`HEADLINES` section of ``md`` (up to the next heading),
    with the path of a step benchmark (a ``step_bench.json``, or the series file that stored it)
    made ``<source>``: the only path those sections name."""
    out: dict[str, str] = {}
    heading = None
    for line in md.splitlines():
        if line.startswith("#"):
            heading = line if HEADLINES.match(line) else None
            if heading:
                out[heading] = ""
        elif heading:
            line = re.sub(r"`[^`]*(step_bench\.json|series\.json\.gz)`", "<source>", line)
            out[heading] += line + "\n"
    return out


def rederive(series: Path, out: Path) -> list[tuple[Path, Path]]:
    """Rebuild the report of ``series`` into ``out`` (with the options it stored); returns each
    committed ``report.md`` beside or below ``series`` with its rebuilt counterpart."""
    assert main([str(series), "--out", str(out), "--no-series"]) == 0
    committed = sorted(series.parent.rglob("report.md"))
    return [(c, out / c.relative_to(series.parent)) for c in committed]


def assert_same_headlines(committed: Path, rebuilt: Path) -> None:
    want = headline_sections(committed.read_text())
    assert want, f"{committed}: no headline section to compare"
    got = headline_sections(rebuilt.read_text())
    assert {h: got.get(h) for h in want} == want, committed


@pytest.mark.parametrize("series", SERIES, ids=[str(s.relative_to(RESULTS)) for s in SERIES])
def test_a_stored_report_rederives_from_its_series_file(series, tmp_path):
    for committed, rebuilt in rederive(series, tmp_path):
        assert_same_headlines(committed, rebuilt)


def index_rows(report: Path) -> tuple[Path, list[str]]:
    """The folder of ``report``'s study (``<date>/<study>``) and the rows of the day's
    ``index.md`` that link into it."""
    date, top = report.relative_to(RESULTS).parts[:2]
    index = (RESULTS / date / "index.md").read_text().splitlines()
    link = re.compile(rf"\]\({re.escape(top)}(/|\))")
    return RESULTS / date / top, [row for row in index if link.search(row)]


def test_every_report_without_a_series_file_is_marked_not_rederivable_in_its_index():
    unmarked, stale = [], []
    for report in sorted(RESULTS.rglob("report.md")):
        study, rows = index_rows(report)
        marked = any(NOT_REDERIVABLE in row for row in rows)
        folders = [report.parent, *report.parent.parents]  # a study may hold several reports
        stored = folders[: folders.index(study) + 1]
        if any((f / SERIES_FILE).is_file() for f in stored):
            stale += [str(report.relative_to(RESULTS))] if marked else []
        elif not marked:
            unmarked.append(str(report.relative_to(RESULTS)))
    assert unmarked == [], f"not in their index as {NOT_REDERIVABLE!r}"
    assert stale == [], f"marked {NOT_REDERIVABLE!r} but stored with a series file"


def test_the_headline_sections_are_found_in_a_stored_report():
    md = (RESULTS / "2026-12-02" / "loss_parity_005_cpu" / "report.md").read_text()
    found = headline_sections(md)
    assert [h.split(" (")[0] for h in found] == [
        "## Compute-equivalent verdict",
        "## Final validation loss per variant",
        "## Paired difference vs `norm=layer`",
        "## Speed verdict",
    ]
    assert "| `norm=rms` | 7 | +0.0001 |" in found[next(h for h in found if "Paired" in h)]
    assert "From <source> (`normlab-bench step`" in found[next(h for h in found if "Speed" in h)]
    ladder = headline_sections((RESULTS / "2026-12-02" / "ladder_cpu" / "report.md").read_text())
    assert "## `norm=rms` vs `norm=layer` at each size" in ladder and "## Sizes" in ladder


def test_a_results_folder_stored_with_its_series_rederives_and_a_changed_number_is_caught(
    tmp_path,
):
    study = tmp_path / "results" / "2026-12-31" / "parity"
    assert main([str(make_sweep(tmp_path / "sweep")), "--margin", "0.05", "--out", str(study)]) == 0
    ((committed, rebuilt),) = rederive(study / SERIES_FILE, tmp_path / "again")
    assert_same_headlines(committed, rebuilt)
    first, again = committed.read_text().splitlines(), rebuilt.read_text().splitlines()
    differ = [a for a, b in zip(first, again, strict=True) if a != b]
    assert differ == [f"- Runs from: `{tmp_path / 'sweep'}`"]  # the source paths line, only
    committed.write_text(committed.read_text().replace("| 3.0500 |", "| 3.0400 |"))
    with pytest.raises(AssertionError):
        assert_same_headlines(committed, rebuilt)
