"""The one process wrapper: however a child ends, its owner hears how, in words."""

from __future__ import annotations

from app.json_process import JsonProcess
from app.process import ChildProcess, ProcessOutcome


def run_to_end(qtbot, proc: ChildProcess, args: list[str], program: str | None = None) -> ProcessOutcome:
    with qtbot.waitSignal(proc.sig_finished, timeout=20000) as finished:
        if program is None:
            proc.start(args)
        else:
            proc.start(args, program=program)
    return finished.args[0]


def test_lines_arrive_whole_and_a_failing_exit_is_reported_with_its_last_words(qtbot):
    proc = ChildProcess("the test tool")
    lines: list[bytes] = []
    proc.sig_lines.connect(lines.extend)
    code = "import sys; print('one'); print('two', end=''); sys.stderr.write('ValueError: bad input\\n'); sys.exit(3)"
    outcome = run_to_end(qtbot, proc, ["-c", code])
    assert lines == [b"one", b"two"]  # the last line arrives even without a newline
    assert not outcome.ok and not outcome.crashed and outcome.code == 3
    assert str(outcome) == "the test tool exited with code 3"
    assert outcome.last_error == "ValueError: bad input" == outcome.last_line


def test_a_signal_is_named(qtbot):
    proc = ChildProcess("the engine process")
    outcome = run_to_end(qtbot, proc, ["-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert outcome.crashed and outcome.signal_name == "SIGKILL" and outcome.exit_status == -9
    assert str(outcome).startswith("the engine process was stopped by SIGKILL (killed")


def test_a_program_that_cannot_start_says_so(qtbot):
    proc = ChildProcess("the build")
    outcome = run_to_end(qtbot, proc, [], program="/nonexistent/program")
    assert not outcome.started and not outcome.ok and "could not start" in str(outcome)


def test_a_stop_the_app_asked_for_is_expected_and_json_tools_stay_quiet_about_it(qtbot):
    tool = JsonProcess("the test tool")
    finished: list[ProcessOutcome] = []
    tool.sig_finished.connect(finished.append)
    tool._proc.start(["-c", "import time; print('{\"type\": \"hello\"}', flush=True); time.sleep(30)"])
    with qtbot.waitSignal(tool.sig_message, timeout=20000) as message:
        pass
    assert message.args == [{"type": "hello"}]
    with qtbot.waitSignal(tool._proc.sig_finished, timeout=5000) as ended:
        tool.stop()
    assert ended.args[0].expected and finished == []


def test_a_pretty_printed_document_arrives_as_one_message(qtbot):
    tool = JsonProcess("the test tool")
    messages: list[dict] = []
    tool.sig_message.connect(messages.append)
    with qtbot.waitSignal(tool.sig_finished, timeout=20000) as finished:
        tool._proc.start(["-c", "import json; print(json.dumps({'a': 1, 'b': [2, 3]}, indent=2))"])
    assert finished.args[0].ok and messages == [{"a": 1, "b": [2, 3]}]
