"""The schema's keys and groups as ``train`` shows them: every leaf key of ``CliConfig`` with its
default and one-line meaning (read from the field comments of ``normlab/config/``, the comments
of ``conf/`` and the dataclasses' docstrings), the config groups and their options, the "did you
mean" line for an unknown key or option, and the text ``train --help`` prints.

Why: docs/running.md
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import io
import re
import textwrap
import tokenize
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any

from normlab import config


@dataclasses.dataclass(frozen=True)
class Key:
    """One leaf key of the schema: ``name`` dotted (``optim.lr``), its default and meaning."""

    name: str
    default: Any
    meaning: str


@cache
def _field_comments() -> dict[tuple[str, str], str]:
    """``(class name, field name) -> comment`` for every commented field in ``normlab/config/``
    (the comment on any line of the field's statement, ``#`` and spaces stripped)."""
    out = {}
    for path in sorted(Path(config.__file__).parent.glob("*.py")):
        out.update(_module_field_comments(path.read_text()))
    return out


def _module_field_comments(source: str) -> dict[tuple[str, str], str]:
    """``_field_comments`` of one module's source."""
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    out = {}
    for cls in ast.walk(ast.parse(source)):
        if not isinstance(cls, ast.ClassDef):
            continue
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                lines = range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
                text = " ".join(comments[n] for n in lines if n in comments)
                if text:
                    out[(cls.name, stmt.target.id)] = text
    return out


def _yaml_comments(path: Path) -> dict[str, str]:
    """``key -> comment`` of the ``key: value  # comment`` lines at the top level of a YAML file."""
    found = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            m = re.match(r"^(\w+):[^#]*#\s*(.+)$", line)
            if m:
                found[m.group(1)] = m.group(2).strip()
    return found


def _docstring_sentence(owner: type, name: str) -> str | None:
    """The first sentence of ``owner``'s docstring that is about ``name``: it starts with the
    name in double backquotes, alone or in a list (````a```` / ````b````), quotes removed."""
    doc = " ".join((owner.__doc__ or "").split())
    for sentence in re.split(r"(?<=[.;])\s+(?=``|[A-Z])", doc):
        head = re.match(r"^(``\w+``(\s*(/|,|and)\s*)?)+", sentence)
        if head and f"``{name}``" in head.group(0):
            return sentence.replace("``", "").rstrip(".;")
    return None


def _meaning(owner: type, name: str, default: Any, yaml_comment: str | None) -> str:
    for cls in owner.__mro__:
        text = _field_comments().get((cls.__name__, name))
        if text:
            return text
    text = yaml_comment or _docstring_sentence(owner, name)
    if text:
        return text
    if isinstance(default, Enum):  # the docstring's words before its first ':', '(' or '.'
        head = re.split(r"[:(.]", " ".join((type(default).__doc__ or "").split()), maxsplit=1)[0]
        return f"{head.strip()} (one of: {', '.join(type(default).__members__)})".strip()
    return ""


@cache
def schema_keys(conf_dir: Path) -> tuple[Key, ...]:
    """Every leaf key of ``CliConfig`` with the schema's default and its meaning: the field's
    comment in ``normlab/config/``, else the one in ``conf/train.yaml`` or the group's default
    file, else its dataclass's docstring sentence naming it, else its Enum's docstring."""
    top = _yaml_comments(conf_dir / "train.yaml")
    defaults = default_options(conf_dir)
    out: list[Key] = []

    def walk(cls: type, prefix: str, yaml: dict[str, str]) -> None:
        instance = cls()
        for f in dataclasses.fields(cls):
            value = getattr(instance, f.name)
            if f.default is not dataclasses.MISSING:  # as declared: __post_init__ may resolve it
                value = f.default
            if dataclasses.is_dataclass(value):
                path = conf_dir / f.name / f"{defaults.get(f.name)}.yaml"
                walk(type(value), f"{prefix}{f.name}.", _yaml_comments(path))
                continue
            meaning = _meaning(cls, f.name, value, yaml.get(f.name))
            out.append(Key(prefix + f.name, value, " ".join(meaning.split())))

    walk(config.CliConfig, "", top)
    return tuple(out)


def default_options(conf_dir: Path) -> dict[str, str]:
    """``group -> option`` of the defaults list of ``conf/train.yaml`` (``model: gpt2_small``)."""
    text = (conf_dir / "train.yaml").read_text()
    return dict(re.findall(r"^  - (\w+): (\w+)\s*$", text, flags=re.MULTILINE))


def group_options(conf_dir: Path) -> dict[str, list[str]]:
    """``group -> its option names`` for every config group folder of ``conf/`` (``hydra/launcher``
    included)."""
    return {
        str(d.relative_to(conf_dir)): sorted(p.stem for p in d.glob("*.yaml"))
        for d in sorted(conf_dir.rglob("*"))
        if d.is_dir() and any(d.glob("*.yaml"))
    }


def suggest_key(key: str, names: list[str]) -> str | None:
    """The key meant by an unknown ``key``: a key of the same last part under another group
    (``lr`` -> ``optim.lr``), else the closest spelling of the whole key, else of its last part
    within the same group (``max_step`` -> ``max_steps``, ``optim.lrr`` -> ``optim.lr``)."""
    leaf = key.rsplit(".", 1)[-1]
    same_leaf = [n for n in names if n.rsplit(".", 1)[-1] == leaf]
    if same_leaf:
        return " or ".join(same_leaf[:3])
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.75)
    if close:
        return close[0]
    parent = key.rsplit(".", 1)[0] + "." if "." in key else ""
    siblings = [n for n in names if n.startswith(parent) and "." not in n[len(parent) :]]
    close = difflib.get_close_matches(leaf, [n[len(parent) :] for n in siblings], n=1, cutoff=0.6)
    return parent + close[0] if close else None


def unknown_key(key: str, value: str, conf_dir: Path) -> str:
    """One line for a ``key=value`` override whose key is not in the schema."""
    names = [k.name for k in schema_keys(conf_dir)] + list(group_options(conf_dir))
    hint = suggest_key(key, names)
    fix = f"did you mean {hint}?" if hint else "train --help lists the keys"
    return f"{key}={value}: there is no key '{key}' in the config; {fix}"


#: Retired group options and what replaces them (``norm=fused`` was ``norm=rms``, impl auto).
RETIRED = {"norm=fused": "norm=rms"}


def unknown_option(group: str, value: str, options: list[str]) -> str:
    """One line for ``group=value`` where ``value`` is not one of ``options`` (a retired option
    names its replacement)."""
    if f"{group}={value}" in RETIRED:
        return f"{group}={value} is retired: use {RETIRED[f'{group}={value}']} (the same norm)"
    close = difflib.get_close_matches(value, options, n=1, cutoff=0.5)
    fix = f"; did you mean {group}={close[0]}?" if close else ""
    listed = ", ".join(options)
    return f"{group}={value}: no option '{value}' in group {group}{fix} (options: {listed})"


def shown(value: Any) -> str:
    """``value`` as ``train --help`` and refusals write it: an Enum's name, ``true``, ``null``."""
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)


#: The key column of ``train --help``; a longer name gets a line of its own.
NAME_WIDTH = 24


def _key_lines(keys: tuple[Key, ...]) -> list[str]:
    """``train --help``'s key lines: one per key, name, default and meaning; keys that share one
    meaning (more than two: ``norm.positions.<position>.kind`` for every position) as one pattern
    with that meaning once, and what each ``<part>`` may be listed once, after its first pattern."""
    by_meaning: dict[str, list[Key]] = {}
    for key in keys:
        by_meaning.setdefault(key.meaning, []).append(key)
    lines, listed = [], set()
    wide = max([12, *(len(shown(k.default)) for k in keys)])  # the default column

    def row(name: str, default: str, meaning: str) -> None:
        if len(name) > NAME_WIDTH:  # its own line: the columns below stay aligned
            lines.append(f"  {name}")
            name = ""
        lines.append(f"  {name:<{NAME_WIDTH}} {default:<{wide}} {meaning}".rstrip())

    for key in keys:
        same = by_meaning[key.meaning]
        if not key.meaning or len(same) <= 2:
            row(key.name, shown(key.default), key.meaning)
        elif key is same[0]:
            columns = list(zip(*(k.name.split(".") for k in same), strict=False))
            parts, values = [], []
            for i, c in enumerate(columns):
                if len(set(c)) == 1:
                    parts.append(c[0])
                    continue
                name = parts[-1].rstrip("s") if parts and i < len(columns) - 1 else "key"
                parts.append(f"<{name}>")
                values.append(f"<{name}>: {', '.join(dict.fromkeys(c))}")
            defaults = {shown(k.default) for k in same}
            default = defaults.pop() if len(defaults) == 1 else "-"
            row(".".join(parts), default, key.meaning)
            lines += [f"  {'':<{NAME_WIDTH}} {'':<{wide}} {v}" for v in values if v not in listed]
            listed.update(values)
    return lines


def help_text(conf_dir: Path) -> str:
    """What ``train --help`` prints: usage, the config groups with their options (the default
    marked ``*``), and every key with the schema's default and its one-line meaning."""
    defaults = default_options(conf_dir)
    lines = [
        "train: train a GPT with a chosen norm (normlab).",
        "",
        "usage: train [KEY=VALUE ...] [GROUP=OPTION ...]     one run (outputs/runs/<time>/)",
        "       train -m KEY=A,B ...                         a sweep (outputs/sweeps/<time>/)",
        "       train resume=<run dir>                       continue a run",
        "       train --cfg job [...]                        print the composed config",
        "       train --hydra-help                           Hydra's own flags",
        "",
        "Config groups (GROUP=OPTION; * the default):",
    ]
    for group, options in group_options(conf_dir).items():
        marked = [f"{o}*" if defaults.get(group) == o else o for o in options]
        wrapped = textwrap.wrap(", ".join(marked), width=80) or [""]
        lines += [f"  {group if i == 0 else '':<16} {part}" for i, part in enumerate(wrapped)]
    lines += ["", "Keys (KEY=VALUE; the schema's default, which a group option may change):"]
    lines += _key_lines(schema_keys(conf_dir))
    lines += ["", "A misspelled key or option is refused with the closest name; exit status 2."]
    return "\n".join(lines)
