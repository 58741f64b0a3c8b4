"""Signals that mean "checkpoint, then stop": SIGTERM, SIGINT and the pre-emption warning.

SIGTERM ends a scheduler's job, SIGINT is Ctrl-C, SIGUSR2 (or ``$SUBMITIT_PREEMPT_SIGNAL``) warns
of a time limit or pre-emption; ``preempt_handler`` finds submitit's handler, which gets the signal
after the checkpoint so that submitit requeues the job.

Why: docs/running.md
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any


def preempt_signal() -> signal.Signals:
    """The signal that warns of a time limit or pre-emption: ``$SUBMITIT_PREEMPT_SIGNAL``, default
    USR2 (sent ``signal_delay_s`` before the end)."""
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2").upper().removeprefix("SIG")
    return signal.Signals["SIG" + name]


class StopSignals:
    """While active (main thread only), the ``watched`` signals set ``signal`` (its name) instead
    of ending the process; a second SIGINT raises KeyboardInterrupt. ``code``: its number (0: none),
    which the ranks max after every step."""

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
    """The handler installed for the pre-emption signal before training (submitit's: requeue and
    exit) when ``name`` is that signal, else None; called after the checkpoint."""
    sig = preempt_signal()
    handler = signal.getsignal(sig)
    return handler if name == sig.name and callable(handler) else None
