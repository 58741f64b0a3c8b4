"""What every config module shares: the error type, the range-check helper, the eps default, and
where the config folder is (``find_conf_dir``, no Hydra, so every layer can find it).

Why: docs/ARCHITECTURE.md
"""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path

#: The one eps default shared by every norm file (``norm.eps: null`` resolves to it). 1e-5 is
#: PyTorch's ``nn.LayerNorm`` default and GPT-2's; using one value for LayerNorm and RMSNorm keeps a
#: kind-vs-kind sweep from changing two things at once.
DEFAULT_EPS = 1e-5


class ConfigError(ValueError):
    """A configuration value is out of range; the message is one line naming the key and value."""


def _require(ok: bool, key: str, value: object, allowed: str) -> None:
    if not ok:
        shown = str(value).lower() if isinstance(value, bool) else repr(value)  # as typed in YAML
        raise ConfigError(f"{key}={shown} is not allowed: {allowed}")


def _as_enum(enum: type[Enum], value: object, key: str) -> Enum:
    """Accept a member or its name (``DataConfig(tokenizer="bpe")`` from Python)."""
    if isinstance(value, enum):
        return value
    _require(
        isinstance(value, str) and value in enum.__members__,
        key,
        value,
        f"allowed: {', '.join(enum.__members__)}",
    )
    return enum[value]


def to_plain(obj: object) -> object:
    """A config dataclass (or part of one) as JSON-ready data: Enums become their names."""
    if isinstance(obj, Enum):
        return obj.name
    if hasattr(obj, "__dataclass_fields__"):
        return {k: to_plain(getattr(obj, k)) for k in obj.__dataclass_fields__}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def find_conf_dir() -> Path:
    """Where ``train.yaml`` and its groups live: ``$NORMLAB_CONF_DIR``, else ``normlab/conf`` in
    the package (a wheel), else the repository's ``conf/``; FileNotFoundError naming them."""
    package = Path(__file__).resolve().parent.parent  # src/normlab
    candidates = [Path(p) for p in [os.environ.get("NORMLAB_CONF_DIR")] if p]
    candidates += [package / "conf", package.parent.parent / "conf"]
    for c in candidates:
        if (c / "train.yaml").is_file():
            return c
    searched = ", ".join(map(str, candidates))
    raise FileNotFoundError(f"normlab cannot find conf/train.yaml; searched: {searched}")
