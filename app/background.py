"""Run slow, GUI-free work (HTTP, file hashing, header reads) on a thread pool
and get the result back on the GUI thread as a signal.

Never for llama.cpp: anything native runs in the worker process.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal


class Task(QObject):
    """Signals (always emitted on the GUI thread, whatever is connected to them):
        sig_done(object): the function's return value.
        sig_failed(str): the exception's message.
        sig_progress(object): whatever the function passed to its ``report`` callback.
    """

    sig_done = Signal(object)
    sig_failed = Signal(str)
    sig_progress = Signal(object)


class _Relay(QObject):
    """Carries results from the pool to the GUI thread and holds every running task until its end.

    The pool thread knows a task only by number: if it held the task itself, dropping that
    reference after the work could be the last one (a widget that started the task was closed
    meanwhile), and the task would be deleted on the pool thread while the GUI thread delivered
    its queued result — a crash inside Qt's event processing. Created on the GUI thread by the
    first ``run``; its signals, emitted on the pool, are queued to it there."""

    done = Signal(int, object)
    failed = Signal(int, str)
    progress = Signal(int, object)

    def __init__(self) -> None:
        super().__init__()
        self.tasks: dict[int, Task] = {}
        self._next = 0
        self.done.connect(self._on_done)
        self.failed.connect(self._on_failed)
        self.progress.connect(self._on_progress)

    def add(self, task: Task) -> int:
        self._next += 1
        self.tasks[self._next] = task
        return self._next

    def _on_done(self, key: int, value: object) -> None:
        task = self.tasks.pop(key, None)
        if task is not None:
            task.sig_done.emit(value)

    def _on_failed(self, key: int, message: str) -> None:
        task = self.tasks.pop(key, None)
        if task is not None:
            task.sig_failed.emit(message)

    def _on_progress(self, key: int, value: object) -> None:
        task = self.tasks.get(key)
        if task is not None:
            task.sig_progress.emit(value)


_relay: _Relay | None = None


class _Runnable(QRunnable):
    def __init__(self, key: int, fn: Callable[..., Any], args: tuple[Any, ...], with_report: bool) -> None:
        super().__init__()
        self.key, self.fn, self.args, self.with_report = key, fn, args, with_report

    def run(self) -> None:
        relay = _relay
        assert relay is not None
        try:
            if self.with_report:
                result = self.fn(*self.args, report=lambda value: relay.progress.emit(self.key, value))
            else:
                result = self.fn(*self.args)
        except Exception as exc:  # shown to the user; the traceback goes to stderr
            traceback.print_exc()
            relay.failed.emit(self.key, str(exc) or type(exc).__name__)
        else:
            relay.done.emit(self.key, result)


def run(fn: Callable[..., Any], *args: Any, with_report: bool = False) -> Task:
    """Start ``fn(*args)`` (with ``report=`` when ``with_report``) on the global pool; call on the GUI thread.

    The task has no Qt parent on purpose: it must outlive a widget closed while
    the work still runs (its connections to that widget simply go away). The
    relay holds it until its result is delivered.
    """
    global _relay
    if _relay is None:
        _relay = _Relay()
    task = Task()
    QThreadPool.globalInstance().start(_Runnable(_relay.add(task), fn, args, with_report))
    return task
