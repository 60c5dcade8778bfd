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
    # Emitted from the pool thread. Connected to this object's own methods, so
    # Qt queues them to the thread the task lives in (the GUI thread); a lambda
    # connected straight to a cross-thread signal would run on the pool thread.
    _done = Signal(object)
    _failed = Signal(str)
    _progress = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self._done.connect(self._relay_done)
        self._failed.connect(self._relay_failed)
        self._progress.connect(self._relay_progress)

    def _relay_done(self, value: object) -> None:
        self.sig_done.emit(value)

    def _relay_failed(self, message: str) -> None:
        self.sig_failed.emit(message)

    def _relay_progress(self, value: object) -> None:
        self.sig_progress.emit(value)


class _Runnable(QRunnable):
    def __init__(self, task: Task, fn: Callable[..., Any], args: tuple[Any, ...], with_report: bool) -> None:
        super().__init__()
        self.task, self.fn, self.args, self.with_report = task, fn, args, with_report

    def run(self) -> None:
        try:
            if self.with_report:
                result = self.fn(*self.args, report=self.task._progress.emit)
            else:
                result = self.fn(*self.args)
        except Exception as exc:  # shown to the user; the traceback goes to stderr
            traceback.print_exc()
            self.task._failed.emit(str(exc) or type(exc).__name__)
        else:
            self.task._done.emit(result)


def run(fn: Callable[..., Any], *args: Any, with_report: bool = False) -> Task:
    """Start ``fn(*args)`` (with ``report=`` when ``with_report``) on the global pool.

    The task has no Qt parent on purpose: it must outlive a widget closed while
    the work still runs (its connections to that widget simply go away).
    """
    task = Task()
    QThreadPool.globalInstance().start(_Runnable(task, fn, args, with_report))
    return task


class Running:
    """Keeps tasks alive until they end: a task has no Qt parent, so a widget that starts one holds it here."""

    def __init__(self) -> None:
        self._tasks: list[Task] = []

    def __len__(self) -> int:
        return len(self._tasks)

    def add(self, task: Task) -> Task:
        self._tasks.append(task)
        task.sig_done.connect(lambda _r: self._forget(task))
        task.sig_failed.connect(lambda _r: self._forget(task))
        return task

    def _forget(self, task: Task) -> None:
        if task in self._tasks:
            self._tasks.remove(task)
