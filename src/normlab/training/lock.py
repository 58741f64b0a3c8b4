"""One process owns a run dir: ``own_run_dir`` holds ``run_dir/.normlab.lock`` for the run.

The lock is an exclusive ``flock`` on that file (never through a link), which the kernel drops
when its process dies: a file left by a dead process is taken over with a warning. The file names
its holder (pid, host, start) for the line that refuses a second writer. Under torchrun rank 0
takes it and every rank learns whether it did.

Why: docs/running.md
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from normlab.config import ConfigError
from normlab.training import distributed

log = logging.getLogger(__name__)

LOCK_FILE = ".normlab.lock"


class RunDirBusy(ConfigError):
    """Another live process holds the run dir (its pid named); this one must change nothing."""


def _holder(fd: int) -> dict[str, str]:
    """Who the lock file says holds it: ``pid``, ``host``, ``started`` (short printable text;
    empty when the file says nothing readable: it is not trusted)."""
    try:
        doc = json.loads(os.pread(fd, 1024, 0))
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    keep = ("pid", "host", "started")
    return {k: "".join(c for c in str(doc[k])[:64] if c.isprintable()) for k in keep if k in doc}


def _open(path: Path) -> int:
    """The lock file's descriptor, created if absent; ConfigError for a link or non-file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ConfigError(f"{path} is a link: remove it (normlab's lock file is not)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"{path} is not a regular file: remove it")
    return fd


def _is_at(path: Path, fd: int) -> bool:
    """Whether ``path`` (not followed) is the file open as ``fd``."""
    try:
        st, mine = os.stat(path, follow_symlinks=False), os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def take(run_dir: Path) -> int:
    """Lock ``run_dir`` (created if absent) for this process; returns the lock file's descriptor.
    Raises RunDirBusy (a live holder), ConfigError (a link, not a file) or OSError."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    while True:
        fd = _open(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            h = _holder(fd)
            os.close(fd)
            who = f"pid {h.get('pid', '?')} on {h.get('host', '?')} since {h.get('started', '?')}"
            raise RunDirBusy(
                f"run dir {run_dir} is in use by {who} (it holds {LOCK_FILE}): one process "
                "writes a run dir at a time; wait for it to end, or use another run dir"
            ) from None
        if _is_at(path, fd):
            break
        os.close(fd)  # its holder removed that file as we locked it: lock the one there now
    if h := _holder(fd):
        log.warning(
            "taking over %s left by pid %s on %s (started %s): that process no longer holds it",
            path,
            h.get("pid", "?"),
            h.get("host", "?"),
            h.get("started", "?"),
        )
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%FT%T%z")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
    return fd


def release(run_dir: Path, fd: int) -> None:
    """Remove the lock file (if it is still the one ``fd`` locks), then unlock it."""
    path = run_dir / LOCK_FILE
    if _is_at(path, fd):
        with contextlib.suppress(OSError):
            path.unlink()
    os.close(fd)  # closing the last descriptor drops the flock


@contextlib.contextmanager
def own_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s lock for the block (rank 0 takes it; every rank raises RunDirBusy or
    ConfigError if it could not); a run dir it created and left empty is removed."""
    created = not run_dir.exists()
    fd, refusal = None, None
    if distributed.is_main():
        try:
            fd = take(run_dir)
        except ConfigError as e:
            refusal = (type(e) is RunDirBusy, str(e))
        except OSError as e:
            refusal = (False, f"cannot lock run dir {run_dir}: {e.strerror or e}")
    refusal = distributed.broadcast(refusal)  # every rank stops, or none
    if refusal is not None:
        if created:
            with contextlib.suppress(OSError):
                run_dir.rmdir()
        busy, message = refusal
        raise RunDirBusy(message) if busy else ConfigError(message)
    try:
        yield
    finally:
        if fd is not None:
            release(run_dir, fd)
            if created:
                with contextlib.suppress(OSError):
                    run_dir.rmdir()  # only if empty: a refused run leaves no run dir
