"""Background tasks hand their results to the GUI thread."""

from __future__ import annotations

import threading

from app import background


def test_results_and_progress_arrive_on_the_gui_thread_even_for_lambdas(qtbot):
    gui = threading.get_ident()
    seen: list[tuple[str, object, bool]] = []

    def work(n: int, report) -> int:  # noqa: ANN001
        assert threading.get_ident() != gui  # the work itself runs on the pool
        report(n)
        return n * 2

    task = background.run(work, 21, with_report=True)
    task.sig_progress.connect(lambda v: seen.append(("progress", v, threading.get_ident() == gui)))
    with qtbot.waitSignal(task.sig_done, timeout=5000):
        task.sig_done.connect(lambda v: seen.append(("done", v, threading.get_ident() == gui)))
    assert ("done", 42, True) in seen
    assert all(on_gui for _, _, on_gui in seen)


def test_failures_arrive_as_messages(qtbot):
    def boom() -> None:
        raise ValueError("the disk is on fire")

    task = background.run(boom)
    with qtbot.waitSignal(task.sig_failed, timeout=5000) as failed:
        pass
    assert failed.args == ["the disk is on fire"]


def test_a_task_nobody_holds_is_destroyed_on_the_gui_thread_not_the_pool(qtbot):
    """A widget closed while its task runs drops the task; the pool thread must not delete it.

    Deleting the task on the pool thread while the GUI thread delivers its queued result is a
    use-after-free: the app tests crashed that way, now and then, in Qt's event processing after
    a load sheet was closed while it still read the model's header."""
    import gc

    from PySide6.QtCore import Qt

    gui = threading.get_ident()
    release = threading.Event()
    destroyed_on: list[bool] = []
    finished = threading.Event()

    def work() -> int:
        release.wait(10)
        return 1

    task = background.run(work)
    task.destroyed.connect(lambda *_: destroyed_on.append(threading.get_ident() == gui),
                           Qt.ConnectionType.DirectConnection)
    task.sig_done.connect(lambda _v: finished.set())
    del task
    gc.collect()
    release.set()
    qtbot.waitUntil(lambda: bool(destroyed_on), timeout=5000)
    assert destroyed_on == [True]
    assert finished.is_set()  # and its result was still delivered, though nobody held it
