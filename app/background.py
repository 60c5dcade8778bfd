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
    """Signals:
        sig_done(object): the function's return value.
        sig_failed(str): the exception's message.
        sig_progress(object): whatever the function passed to its ``report`` callback.
    """

    sig_done = Signal(object)
    sig_failed = Signal(str)
    sig_progress = Signal(object)


class _Runnable(QRunnable):
    def __init__(self, task: Task, fn: Callable[..., Any], args: tuple[Any, ...], with_report: bool) -> None:
        super().__init__()
        self.task, self.fn, self.args, self.with_report = task, fn, args, with_report

    def run(self) -> None:
        try:
            if self.with_report:
                result = self.fn(*self.args, report=self.task.sig_progress.emit)
            else:
                result = self.fn(*self.args)
        except Exception as exc:  # shown to the user; the traceback goes to stderr
            traceback.print_exc()
            self.task.sig_failed.emit(str(exc) or type(exc).__name__)
        else:
            self.task.sig_done.emit(result)


def run(fn: Callable[..., Any], *args: Any, with_report: bool = False) -> Task:
    """Start ``fn(*args)`` (with ``report=`` when ``with_report``) on the global pool.

    The task has no Qt parent on purpose: it must outlive a widget closed while
    the work still runs (its connections to that widget simply go away).
    """
    task = Task()
    QThreadPool.globalInstance().start(_Runnable(task, fn, args, with_report))
    return task
