"""Signals that mean "checkpoint, then stop": SIGTERM, SIGINT and the pre-emption warning.

SIGTERM is how SLURM (``scancel``, a time limit) and most schedulers end a job, SIGINT is Ctrl-C,
and SIGUSR2 (or ``$SUBMITIT_PREEMPT_SIGNAL``) is what submitit (``signal_delay_s``) and SLURM's
``--signal`` send before a time limit or a pre-emption. :func:`preempt_handler` finds submitit's
handler, which the signal is handed on to once the checkpoint is saved, so that submitit requeues
the job.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any


def preempt_signal() -> signal.Signals:
    """The signal that warns of a time limit or pre-emption: submitit's
    (``$SUBMITIT_PREEMPT_SIGNAL``,
    default USR2; hydra-submitit-launcher asks SLURM for it ``signal_delay_s`` before the end)."""
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2").upper().removeprefix("SIG")
    return signal.Signals["SIG" + name]


class StopSignals:
    """While active, SIGTERM, SIGINT and :func:`preempt_signal` set :attr:`signal` (the signal's
    name) instead of ending the process, so the loop can finish its step, save a checkpoint and
    stop. A second SIGINT raises KeyboardInterrupt at once. Outside the main thread (where handlers
    cannot be set) it does nothing.

    :attr:`code` is the signal's number (0: none), the value the ranks agree on at the end of every
    step (the largest wins), so a signal that reaches one rank stops all of them after the same
    step.
    """

    def __init__(self) -> None:
        self.signal: str | None = None
        self._previous: dict[int, Any] = {}

    def watched(self) -> tuple[int, ...]:
        """The signals handled while active."""
        return (signal.SIGTERM, signal.SIGINT, preempt_signal())

    @property
    def code(self) -> int:
        return int(signal.Signals[self.signal]) if self.signal else 0

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name  # no logging here: a handler may interrupt it

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in dict.fromkeys(self.watched()):
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def preempt_handler(name: str) -> Callable[[int, Any], Any] | None:
    """The Python handler installed for the pre-emption signal before training (submitit's: it
    requeues the job and exits, on rank 0), when ``name`` is that signal; else None (a plain run,
    or another signal). Called after the checkpoint that the signal caused."""
    sig = preempt_signal()
    handler = signal.getsignal(sig)
    return handler if name == sig.name and callable(handler) else None
