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
