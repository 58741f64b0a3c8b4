"""Command-line overrides read with Hydra's public grammar: sweeps expanded, values quoted.

Used by ``train`` (before Hydra runs: resume by path, the up-front composition check) and by
``normlab-prepare`` (which runs every combination of a comma sweep itself).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException


def expand(overrides: list[str]) -> list[list[str]]:
    """Comma lists and ``range``/``choice`` sweeps -> one override list per combination.

    The order is Hydra's BasicSweeper's: one slot per key in the order keys first appear (a key
    given again replaces its slot's values), the last key varying fastest (``itertools.product``).

    Raises:
        hydra.errors.OverrideParseException: an override Hydra's grammar rejects.
        hydra.errors.HydraException: a sweep BasicSweeper cannot expand (an ``interval``).
    """
    slots: dict[str, list[str]] = {}
    for o in OverridesParser.create().parse_overrides(overrides):
        key = o.get_key_element()
        if o.is_sweep_override():
            if not o.is_discrete_sweep():
                raise HydraException(f"{o.input_line}: a {o.value_type.name} cannot be expanded")
            slots[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
        else:
            slots[key] = [f"{key}={o.get_value_element_as_str()}"]
    return [list(job) for job in itertools.product(*slots.values())]


def one_per_value(overrides: list[str], vary: Callable[[str], bool]) -> list[list[str]]:
    """Override lists that together use every value of each sweep whose key ``vary`` accepts: the
    first list holds every sweep's first value; each further list changes one of those sweeps to
    one of its other values. ``1 + sum(len(values) - 1)`` lists, not the product.
    """
    slots: dict[str, list[str]] = {}
    for o in OverridesParser.create().parse_overrides(overrides):
        key = o.get_key_element()
        if o.is_sweep_override() and o.is_discrete_sweep():
            values = [f"{key}={v}" for v in o.sweep_string_iterator()]
            slots[key] = values if vary(o.key_or_group) else values[:1]
        else:
            slots[key] = [o.input_line]
    first = [values[0] for values in slots.values()]
    jobs = [first]
    for i, values in enumerate(slots.values()):
        jobs += [[*first[:i], v, *first[i + 1 :]] for v in values[1:]]
    return jobs


def quote(value: str) -> str:
    """``value`` as a single-quoted string of Hydra's grammar (a path holding ``=``, ``,`` or
    spaces). Quotes are escaped; backslashes only where they precede a quote or the end."""
    body = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value)
    return f"'{body}'"


def value_of(args: list[str], key: str) -> str | None:
    """The value of the last ``key=value`` override in ``args`` (None if absent), unquoted by
    Hydra's grammar when it parses; else the raw text after the first ``=`` (``resume=a=b``)."""
    found = None
    for a in args:
        if "=" not in a or a.lstrip("+~").split("=", 1)[0] != key:
            continue
        try:
            parsed = OverridesParser.create().parse_override(a)
            found = None if parsed.is_sweep_override() else parsed.value()
            found = a.split("=", 1)[1] if found is None or not isinstance(found, str) else found
        except HydraException:
            found = a.split("=", 1)[1]
    return found
