"""A torch-only environment for the GPU kit's rehearsal (``test_gpu_kit.py``): the packages the
device image lacks (``NORMLAB_IMAGE_LACKS``, comma-separated top-level modules) are importable
only from a ``sys.path`` entry under the temporary directory, where ``scripts/gpu_run.sh``
installs the kit. Loaded by Python's ``site`` when this folder is on ``PYTHONPATH``."""

from __future__ import annotations

import importlib.machinery
import os
import sys
import tempfile

_LACKS = {n for n in os.environ.get("NORMLAB_IMAGE_LACKS", "").split(",") if n}
_TMP = os.path.realpath(tempfile.gettempdir())
#: The checkout this file belongs to: its src/ (an editable install) is never "the kit", even when
#: the checkout itself lies under the temporary directory (a fresh clone in /tmp, as CI may make).
_REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _in_kit(path: str) -> bool:
    real = os.path.realpath(path)
    return real.startswith(_TMP + os.sep) and not real.startswith(_REPO + os.sep)


class _KitOnly:
    """Find a module the image lacks in the kit's folder, or nowhere."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] not in _LACKS or "." in name:
            return None  # submodules: found through their (kit) parent package's __path__
        kit = [p for p in sys.path if p and _in_kit(p)]
        spec = importlib.machinery.PathFinder.find_spec(name, kit)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {name!r} in the kit", name=name)
        return spec


if _LACKS:
    sys.meta_path.insert(0, _KitOnly())
