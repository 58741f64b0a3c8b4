"""Where the config folder is: ``conf/train.yaml`` and its groups. No Hydra here, so every layer
(``data`` resolving ``eval_data`` names included) can find it; :mod:`normlab.compose` re-exports
:func:`find_conf_dir`."""

from __future__ import annotations

import os
from pathlib import Path


def find_conf_dir() -> Path:
    """Where ``train.yaml`` and its groups live.

    In order: ``$NORMLAB_CONF_DIR``; ``normlab/conf`` inside the installed package (a wheel ships
    the repository's ``conf/`` there); the repository's top-level ``conf/`` (editable install or a
    source checkout).

    Raises:
        FileNotFoundError: naming the places searched.
    """
    package = Path(__file__).resolve().parent.parent  # src/normlab
    candidates = [Path(p) for p in [os.environ.get("NORMLAB_CONF_DIR")] if p]
    candidates += [package / "conf", package.parent.parent / "conf"]
    for c in candidates:
        if (c / "train.yaml").is_file():
            return c
    searched = ", ".join(map(str, candidates))
    raise FileNotFoundError(f"normlab cannot find conf/train.yaml; searched: {searched}")
