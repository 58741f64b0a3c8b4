"""Docs that cannot rot: every ``train`` command shown in README.md and docs/*.md composes against
the real config; every ``normlab-bench``, ``normlab-study``, ``normlab-eval``, ``normlab-report``,
``normlab-sample`` and ``python -m benchmarks`` command shown names a subcommand and flags that its
``--help`` lists; every relative link in README.md and docs/**/*.md resolves (file and anchor);
every module of src/normlab is in docs/ARCHITECTURE.md's module map and every path of that map
exists; README.md stays an index (at most 250 lines) and, with the topic pages and the docstrings
of src/normlab, carries no commit hash, session talk or "before:" note (measurements and their
code versions live in docs/results/, history in CHANGELOG.md).

A command is found in a fenced code block as a segment (split at ``&&``, ``;``, ``|``) that runs
``train`` (also through ``torchrun`` or ``python -m normlab.commands.train``), ``normlab-prepare``
(the same overrides) or a study script ``bash scripts/<study>.sh`` (composed as
``experiment=<study>`` plus its arguments). ``-m`` sweeps compose once per swept value (every
value is composed, not the product); ``--cfg job`` and ``--help`` compose the overrides beside
them. Placeholders: a whole ``<...>`` argument is dropped, ``<...>`` inside a value becomes ``x``.
"""

from __future__ import annotations

import ast
import functools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from normlab.compose import compose_cli
from normlab.config import ConfigError

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
#: The pages whose commands are composed and whose prose must carry no history: README and the
#: topic pages (docs/results/ holds generated reports and dated measurements).
TOPIC_PAGES = [README, *sorted(DOCS.glob("*.md"))]
#: Every page whose relative links are checked.
ALL_PAGES = [README, *sorted(DOCS.rglob("*.md"))]
README_MAX_LINES = 250

#: ``train`` flags that take no value and leave the overrides to compose.
INFO_FLAGS = {"--help", "-h", "--hydra-help", "--info", "-i", "--resolve"}
#: ``train`` flags that take one value (``--cfg job``).
VALUE_FLAGS = {"--cfg", "-c", "--package", "-p"}
MULTIRUN_FLAGS = {"-m", "--multirun"}


@dataclass(frozen=True)
class Command:
    """One command found in a page: where, the text as written, and what ``train`` gets."""

    page: str
    line: int
    text: str
    args: tuple[str, ...]
    multirun: bool

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def fenced_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of every line inside a ``` fence, backslash continuations joined
    (the number is the first line's)."""
    out: list[tuple[int, str]] = []
    inside = False
    pending: tuple[int, str] | None = None
    for n, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            inside = not inside
            continue
        if not inside:
            continue
        start, body = pending if pending else (n, "")
        body += line.rstrip()
        if body.endswith("\\"):
            pending = (start, body[:-1] + " ")
            continue
        pending = None
        out.append((start, body.strip()))
    return out


def _segments(tokens: list[str]) -> list[list[str]]:
    """Shell tokens split at ``&&``, ``||``, ``;`` and ``|``."""
    out: list[list[str]] = [[]]
    for t in tokens:
        if t in ("&&", "||", ";", "|"):
            out.append([])
        else:
            out[-1].append(t)
    return [s for s in out if s]


def _experiment_file(name: str) -> Path:
    return REPO / "conf" / "experiment" / f"{name}.yaml"


def _train_args(seg: list[str]) -> tuple[list[str], bool] | None:
    """The arguments ``train`` gets from one shell segment and whether the script sweeps them
    (a study script always does: its experiment file is a multirun); None if the segment runs
    neither ``train`` nor a study script."""
    while seg and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", seg[0]):
        seg = seg[1:]  # environment assignments: MAX_TIME_S=60 bash scripts/...
    if not seg:
        return None
    if seg[0] == "train":
        return seg[1:], False
    if seg[0] == "normlab-prepare":  # composes as train does; runs every combination of a sweep
        return [a for a in seg[1:] if a != "--fresh"], True
    if seg[0] == "torchrun" and "train" in seg:
        return seg[seg.index("train") + 1 :], False
    if seg[0] in ("torchrun", "python", "python3") and "normlab.commands.train" in seg:
        return seg[seg.index("normlab.commands.train") + 1 :], False
    if seg[0] == "bash" and len(seg) > 1:
        study = re.fullmatch(r"scripts/(\w+)\.sh", seg[1])
        if study and _experiment_file(study.group(1)).is_file():
            rest = seg[2:]
            if not any(a.startswith("experiment=") for a in rest):
                rest = [f"experiment={study.group(1)}", *rest]
            return rest, True
    return None


def _placeholders(args: list[str]) -> list[str]:
    """``<overrides>`` dropped, ``resume=outputs/runs/<time>`` -> ``resume=outputs/runs/x``."""
    kept = [a for a in args if not re.fullmatch(r"<[^<>]*>|\.\.\.", a)]
    return [re.sub(r"<[^<>]*>", "x", a) for a in kept]


def commands(page: Path) -> list[Command]:
    """Every ``train`` (or study script) command in the fenced blocks of ``page``."""
    return commands_in(page.read_text(), str(page.relative_to(REPO)))


def commands_in(text: str, rel: str) -> list[Command]:
    """Every ``train`` (or study script) command in the fenced blocks of ``text`` (page ``rel``)."""
    found: list[Command] = []
    for n, line in fenced_lines(text):
        if line.startswith(("$", ">")) or not line:
            continue  # a transcript line: what a user typed, shown with its output
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            continue
        for seg in _segments(tokens):
            got = _train_args(seg)
            if got is not None:
                args, multirun = got
                args = _placeholders(args)
                found.append(Command(rel, n, line, tuple(args), multirun))
    return found


def overrides_of(cmd: Command) -> tuple[list[str], bool]:
    """``(overrides, multirun)`` of a command: flags checked and removed.

    Raises:
        ValueError: a flag this test does not know (so a doc cannot show one unchecked).
    """
    args = list(cmd.args)
    multirun = cmd.multirun
    overrides: list[str] = []
    while args:
        a = args.pop(0)
        if a in MULTIRUN_FLAGS:
            multirun = True
        elif a in INFO_FLAGS:
            pass
        elif a in VALUE_FLAGS:
            if not args:
                raise ValueError(f"{a} needs a value")
            args.pop(0)
        elif a.startswith("-"):
            raise ValueError(f"unknown flag {a!r} for train")
        else:
            overrides.append(a)
    for o in overrides:
        name = re.fullmatch(r"experiment=(\w+)", o)
        if name and "mode: MULTIRUN" in _read(_experiment_file(name.group(1))):
            multirun = True
    return overrides, multirun


def _read(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


def jobs(overrides: list[str], multirun: bool) -> list[tuple[str, ...]]:
    """Override lists that together compose every value of every sweep: the first holds each
    sweep's first value, each further one changes one sweep to another of its values.

    Raises:
        ValueError: a sweep (``a,b``) without ``-m``, which ``train`` refuses.
        hydra.errors.HydraException: an override Hydra's grammar rejects.
    """
    slots: list[list[str]] = []
    for o in OverridesParser.create().parse_overrides(overrides):
        if o.is_sweep_override():
            if not multirun:
                raise ValueError(f"{o.input_line}: a sweep needs train -m")
            key = o.get_key_element()
            slots.append([f"{key}={v}" for v in o.sweep_string_iterator()])
        else:
            slots.append([o.input_line])
    first = [values[0] for values in slots]
    out = [tuple(first)]
    for i, values in enumerate(slots):
        out += [(*first[:i], v, *first[i + 1 :]) for v in values[1:]]
    return out


@functools.cache
def compose_once(job: tuple[str, ...]) -> None:
    """Compose and validate ``job`` as ``train`` does (once per distinct override list)."""
    compose_cli(list(job))


def check_command(cmd: Command) -> None:
    """Compose every job of ``cmd``; raises what composition raises."""
    overrides, multirun = overrides_of(cmd)
    for job in jobs(overrides, multirun):
        compose_once(job)


ALL_COMMANDS = [c for page in TOPIC_PAGES for c in commands(page)]


def test_the_pages_show_train_commands():
    """The parser finds the README's own commands (an empty list would test nothing)."""
    readme = [c for c in ALL_COMMANDS if c.page == "README.md"]
    assert any(c.args == ("experiment=quickstart",) for c in readme), readme


@pytest.mark.parametrize("cmd", ALL_COMMANDS, ids=[c.id for c in ALL_COMMANDS])
def test_every_train_command_in_the_docs_composes(cmd: Command):
    try:
        check_command(cmd)
    except Exception as e:  # composition, validation and grammar errors alike
        pytest.fail(f"{cmd.id}: `{cmd.text}` does not compose: {type(e).__name__}: {e}")


def _doc_line(text: str) -> Command:
    """The one command of a page that shows ``text`` in a fenced block."""
    (cmd,) = commands_in(f"```bash\n{text}\n```\n", "self-check.md")
    return cmd


@pytest.mark.parametrize(
    "line",
    [
        "train max_step=10",  # a misspelled key
        "train norm=rsm",  # a misspelled group option
        "train norm.eps=0",  # a value out of range
        "train -m norm=layer,rsm seed=0,1",  # a bad value in the second place of a sweep
        "train norm=layer,rms",  # a sweep without -m
        "train --cfgg job norm=rms",  # a flag train does not have
        "bash scripts/eps_sweep.sh norm.epss=1e-5",  # a study script's bad override
        "bash scripts/setup.sh && train model=tinyy",  # after &&
        "normlab-prepare --fresh data=tinystorie",  # normlab-prepare's overrides
    ],
)
def test_a_bad_command_in_the_docs_fails(line: str):
    """The check itself: each of these lines, shown in a page, fails the test above."""
    with pytest.raises((ConfigError, HydraException, ValueError)):
        check_command(_doc_line(line))


def test_a_good_command_with_flags_and_placeholders_composes():
    cmd = _doc_line(
        "train -m --cfg job experiment=quickstart norm=layer,rms "
        "resume=outputs/runs/<time> <overrides>  # a comment"
    )
    assert overrides_of(cmd) == (
        ["experiment=quickstart", "norm=layer,rms", "resume=outputs/runs/x"],
        True,
    )
    check_command(cmd)


# --- links ---------------------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.M)
FENCE = re.compile(r"```.*?```", re.S)
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|__", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a markdown page (repeats numbered as GitHub does)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
    return out


def links(page: Path) -> list[str]:
    """The link targets of a page, outside code."""
    text = CODE.sub("", page.read_text())
    return [m.group(1) for m in LINK.finditer(text)] + REF_LINK.findall(text)


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` that name no file, or an anchor the file does not have."""
    bad = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target} (no heading #{anchor} in {dest.name})")
    return bad


@pytest.mark.parametrize("page", ALL_PAGES, ids=[str(p.relative_to(REPO)) for p in ALL_PAGES])
def test_every_relative_link_resolves(page: Path):
    assert broken_links(page) == []


def test_a_broken_link_is_found(tmp_path: Path):
    (tmp_path / "there.md").write_text("# A heading\n## `norm=fused`: code\n```\n# not one\n```\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) [ok](there.md#a-heading) [web](https://x.org) `[code](nowhere.md)`\n"
        "[ok](there.md#normfused-code) [gone](nowhere.md) [bad anchor](there.md#not-one)\n"
        "![img](missing.png)\n"
    )
    assert broken_links(page) == [
        "nowhere.md (no such file)",
        "there.md#not-one (no heading #not-one in there.md)",
        "missing.png (no such file)",
    ]


def test_github_slugs():
    assert slug("Resume and faults") == "resume-and-faults"
    assert slug("`norm.impl`: which code runs") == "normimpl-which-code-runs"
    assert slug("Quality x speed, (n = 3)") == "quality-x-speed-n--3"


# --- the module map ------------------------------------------------------------------------------

SRC = REPO / "src" / "normlab"
ARCHITECTURE = DOCS / "ARCHITECTURE.md"


def src_modules() -> list[str]:
    """Every module of the package as a path under src/normlab (``training/loop.py``); an
    ``__init__.py`` only when it holds code (a package's own module)."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "__init__.py" and not path.read_text().strip():
            continue
        out.append(str(path.relative_to(SRC)))
    return out


def module_map(text: str) -> str:
    """The ``## Module map`` section of ARCHITECTURE.md (up to the next ``## `` heading)."""
    m = re.search(r"^## Module map\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, "docs/ARCHITECTURE.md has no '## Module map' section"
    return m.group(1)


def mentioned(module: str, text: str) -> bool:
    """Whether ``text`` names ``module`` (``training/loop.py``) by path or dotted name."""
    dotted = module.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    names = {module, f"normlab.{dotted}"}
    return any(re.search(rf"(?<![\w./]){re.escape(n)}(?![\w/])", text) for n in names)


def missing_modules(text: str, modules: list[str]) -> list[str]:
    return [m for m in modules if not mentioned(m, text)]


def stale_paths(section: str) -> list[str]:
    """Module paths of the map's rows (a first cell holding ``x/y.py``) that name no module."""
    named = re.findall(r"^\|\s*`((?:\w+/)*\w+\.py)`\s*\|", section, re.M)
    return [p for p in named if not (SRC / p).is_file()]


def test_every_module_is_in_the_architecture_map():
    section = module_map(ARCHITECTURE.read_text())
    assert missing_modules(section, src_modules()) == []


def test_every_module_in_the_architecture_map_exists():
    assert stale_paths(module_map(ARCHITECTURE.read_text())) == []


def test_a_module_missing_from_the_map_is_found():
    text = "| `training/loop.py` | the loop |\nand normlab.report.stats\n"
    modules = ["training/loop.py", "report/stats.py", "report/plots.py", "norms/__init__.py"]
    assert missing_modules(text, modules) == ["report/plots.py", "norms/__init__.py"]
    assert missing_modules("`normlab.norms` builds them", ["norms/__init__.py"]) == []
    rows = "| `training/loop.py` | the loop |\n| `training/no_such_module.py` | gone |\n"
    assert stale_paths(rows + "prose naming `tests/test_docs.py`\n") == [
        "training/no_such_module.py"
    ]


# --- README as an index; no history in user docs -------------------------------------------------

#: A commit hash: 7 to 40 hex digits with at least one digit and one letter (not a plain number).
HASH = re.compile(r"(?<![\w.])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w.])")
HISTORY = re.compile(
    r"\b(?:this|last|earlier|previous|next|an earlier|the last) session\b|\bbefore:|"
    r"\bsince [0-9a-f]{7,40}\b",
    re.I,
)


def history_words(text: str) -> list[str]:
    return HASH.findall(text) + [m.group(0) for m in HISTORY.finditer(text)]


def test_readme_is_an_index():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


@pytest.mark.parametrize("page", TOPIC_PAGES, ids=[str(p.relative_to(REPO)) for p in TOPIC_PAGES])
def test_no_commit_hash_or_history_in_user_docs(page: Path):
    assert history_words(page.read_text()) == []


def docstrings(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every docstring of ``path``: the module's, classes', functions'."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    out.append((body[0].lineno, body[0].value.value))
    return out


def history_in_docstrings(path: Path) -> list[str]:
    """``file:line words`` for each docstring of ``path`` that carries a history word."""
    return [
        f"{path.name}:{line} {words}"
        for line, text in docstrings(path)
        if (words := history_words(text))
    ]


def test_no_commit_hash_or_history_in_docstrings():
    """Docstrings state a contract: no commit hash, session talk or "before:" note."""
    bad = [f for path in sorted(SRC.rglob("*.py")) for f in history_in_docstrings(path)]
    assert not bad, "history in docstrings of src/normlab:\n" + "\n".join(bad)


def test_history_in_a_docstring_is_found(tmp_path: Path):
    f = tmp_path / "m.py"
    f.write_text(
        '"""A module."""\n\n\ndef f():\n'
        '    """Measured at 9cc4502; faster since c910f54 landed."""\n'
        "    # before: a comment, not a docstring\n"
    )
    assert history_in_docstrings(f) == ["m.py:5 ['9cc4502', 'c910f54', 'since c910f54']"]


def test_history_words_are_found():
    text = (
        "measured at 9cc4502 (before: 1.50 s); last session's miss; since c910f54 it moved.\n"
        "Not these: 1234567 tokens, 0.1985826, the word decade, sha256 digests named 'digest'."
    )
    assert history_words(text) == [
        "9cc4502",
        "c910f54",
        "before:",
        "last session",
        "since c910f54",
    ]


#: The tools of the workplace where normlab is built (its agents' device machine, their file
#: transfers, issue tracker and helpers): a user of normlab has none of them, so no user doc may
#: tell a reader to use one. Regexes, matched case-insensitively; ``carry`` and ``.library`` as
#: those tools spell them, so the English "carry over" and ``torch.library`` stay allowed. The
#: user docs: README.md and every topic page of docs/, ARCHITECTURE.md included (a contributor has
#: none of these tools either); docs/results/ holds dated records, not instructions.
WORKPLACE_TOOLS = (
    r"device tool",
    r"`run` tool",
    r"give_back",
    r"files_at",
    r"files_fetch",
    r"`carry`|\bcarry=|\bcarry: \[",
    r"(?<!\w)\.library\b",
    r"issues show",
    r"duplicates --change",
    r"subagent",
    r"lease script",
)
WORKPLACE = re.compile("|".join(f"(?:{t})" for t in WORKPLACE_TOOLS), re.I)


@pytest.mark.parametrize("page", TOPIC_PAGES, ids=[str(p.relative_to(REPO)) for p in TOPIC_PAGES])
def test_user_docs_name_no_tool_of_the_workplace(page: Path):
    text = page.read_text()
    found = [
        f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
        for m in WORKPLACE.finditer(text)
    ]
    assert found == []


def test_workplace_tools_are_found_and_plain_words_are_not():
    bad = (
        "Use the device tool (`run` tool) with `carry`, then give_back; read files_at or "
        "files_fetch, /work/.library/README.md, `issues show 35`, `duplicates --change`, "
        "a subagent, the lease script."
    )
    assert len(WORKPLACE.findall(bad)) == len(WORKPLACE_TOOLS)
    fine = "the speed-up does not carry over; torch.library.register_fake; run the tool chain"
    assert WORKPLACE.findall(fine) == []


# --- the other commands: subcommands and flags ---------------------------------------------------

#: The console scripts (and ``python -m benchmarks``) whose subcommand and flags shown in a fenced
#: block must exist: the module that ``--help`` runs for each.
OTHER_COMMANDS = {
    "normlab-bench": "normlab.commands.bench",
    "normlab-study": "normlab.commands.study",
    "normlab-eval": "normlab.commands.evaluate",
    "normlab-report": "normlab.commands.report",
    "normlab-sample": "normlab.commands.sample",
    "benchmarks": "benchmarks",
}


@dataclass(frozen=True)
class OtherCommand:
    """One ``normlab-*`` (or ``python -m benchmarks``) command in a page: its program, its
    subcommand (None for the program's own mode) and the ``--flags`` it shows."""

    page: str
    line: int
    text: str
    program: str
    sub: str | None
    flags: tuple[str, ...]


def _other_command(seg: list[str]) -> tuple[str, list[str]] | None:
    """``(program, arguments)`` of a segment that runs one of :data:`OTHER_COMMANDS`."""
    while seg and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", seg[0]):
        seg = seg[1:]
    if seg and seg[0] in OTHER_COMMANDS:
        return seg[0], seg[1:]
    if len(seg) > 2 and seg[0] in ("python", "python3") and seg[1:3] == ["-m", "benchmarks"]:
        return "benchmarks", seg[3:]
    return None


def other_commands_in(text: str, rel: str) -> list[OtherCommand]:
    """Every :data:`OTHER_COMMANDS` command in the fenced blocks of ``text`` (page ``rel``)."""
    found: list[OtherCommand] = []
    for n, line in fenced_lines(text):
        if line.startswith(("$", ">")) or not line:
            continue
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            continue
        for seg in _segments(tokens):
            got = _other_command(seg)
            if got is None:
                continue
            program, args = got
            first = args[0] if args else ""
            sub = first if re.fullmatch(r"[a-z][\w-]*", first) and program in SUBCOMMANDS else None
            flags = tuple(a.split("=", 1)[0] for a in args if a.startswith("--"))
            found.append(OtherCommand(rel, n, line, program, sub, flags))
    return found


#: The programs that have subcommands (the others take positional paths or overrides).
SUBCOMMANDS = ("normlab-bench", "normlab-study", "benchmarks")


@functools.cache
def help_text(program: str, sub: str | None) -> tuple[int, str]:
    """``(exit status, output)`` of ``<program> [sub] --help``, run as a subprocess from the
    repository root (``benchmarks`` is a folder of the checkout)."""
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", OTHER_COMMANDS[program], *([sub] if sub else []), "--help"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


def subcommands(program: str) -> set[str]:
    """The subcommands ``<program> --help`` names: ``prog sub`` in its usage lines, or
    ``{a,b,c}``."""
    _, text = help_text(program, None)
    name = "python -m benchmarks" if program == "benchmarks" else program
    found = set(re.findall(rf"{re.escape(name)} ([a-z][\w-]*)", text))
    for group in re.findall(r"\{([\w,-]+)\}", text):
        found |= set(group.split(","))
    return found


def command_problems(cmd: OtherCommand) -> list[str]:
    """What in ``cmd`` its program does not have: a subcommand, a flag."""
    if cmd.sub is not None and cmd.sub not in subcommands(cmd.program):
        return [f"{cmd.program} has no subcommand {cmd.sub!r}"]
    rc, text = help_text(cmd.program, cmd.sub)
    if rc != 0:
        return [f"{cmd.program} {cmd.sub or ''} --help exits {rc}: {text.strip()[-200:]}"]
    known = set(re.findall(r"--[a-z][\w-]*", text))
    return [f"{cmd.program} {cmd.sub or ''}: no flag {f}" for f in cmd.flags if f not in known]


ALL_OTHER = [
    c
    for page in TOPIC_PAGES
    for c in other_commands_in(page.read_text(), str(page.relative_to(REPO)))
]


def test_the_pages_show_other_commands():
    programs = {c.program for c in ALL_OTHER}
    assert {"normlab-bench", "normlab-study", "normlab-eval", "benchmarks"} <= programs, programs


@pytest.mark.parametrize("cmd", ALL_OTHER, ids=[f"{c.page}:{c.line}" for c in ALL_OTHER])
def test_every_other_command_in_the_docs_exists(cmd: OtherCommand):
    assert command_problems(cmd) == [], cmd.text


@pytest.mark.parametrize(
    "line",
    [
        "normlab-bench settings model=small",  # moved to python -m benchmarks
        "normlab-bench step --baseline",  # a flag that moved
        "normlab-study fp16-statistic",  # a misspelled subcommand
        "normlab-eval outputs/runs/x --task piqa",  # a misspelled flag
        "python -m benchmarks baseline --b norm=rms",  # a flag of another command
    ],
)
def test_a_bad_other_command_is_found(line: str):
    (cmd,) = other_commands_in(f"```bash\n{line}\n```\n", "self-check.md")
    assert command_problems(cmd) != []
