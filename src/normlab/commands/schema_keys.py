"""The keys of the schema (:class:`normlab.config.CliConfig`) with their defaults and meanings, and
"did you mean" for a key or group option that does not exist. No Hydra, no torch: read from the
dataclasses and the comments of ``normlab/config/`` and ``conf/``.
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
    """:func:`_field_comments` of one module's source."""
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
    if isinstance(default, Enum):
        doc = (type(default).__doc__ or "").strip().splitlines()
        return f"{doc[0] if doc else ''} (one of: {', '.join(type(default).__members__)})".strip()
    return ""


@cache
def schema_keys(conf_dir: Path) -> tuple[Key, ...]:
    """Every leaf key of :class:`normlab.config.CliConfig`, in schema order, with the default of
    the schema itself (``conf/`` files may set others) and its one-line meaning: the field's
    comment in ``normlab/config/``, else the comment in ``conf/train.yaml`` or the group default,
    else the first sentence of its dataclass's docstring naming it, else its Enum's docstring."""
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
    """One line for ``group=value`` where ``value`` is not one of ``options``."""
    if f"{group}={value}" in RETIRED:
        return f"{group}={value} is retired: use {RETIRED[f'{group}={value}']} (the same norm)"
    close = difflib.get_close_matches(value, options, n=1, cutoff=0.5)
    fix = f"did you mean {group}={close[0]}? " if close else ""
    listed = ", ".join(options)
    return f"{group}={value}: no option '{value}' in group {group}; {fix}(options: {listed})"


def _shown(value: Any) -> str:
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)


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
    for key in schema_keys(conf_dir):
        default = _shown(key.default)
        lines.append(f"  {key.name:<24} {default:<12} {key.meaning}".rstrip())
    lines += ["", "A misspelled key or option is refused with the closest name; exit status 2."]
    return "\n".join(lines)
