"""`run_command`: SIGINT / SIGTERM end a command with one line and exit code 130 / 143, and an
interruption inside `signals_deferred` waits for the end of the block (where a writer gets registered)."""

import signal
import threading

import pytest

from indexed_dataset.cli_support import run_command, signals_deferred


def signal_self(signal_number: int) -> None:
    """Send a signal to this very thread: it is handled before the call returns (os.kill could land on
    another thread of the process and be handled a moment later)."""
    signal.pthread_kill(threading.get_ident(), signal_number)


@pytest.mark.parametrize("signal_number, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_ends_the_command_with_one_line(signal_number, code, capsys):
    cleaned = []

    def command() -> int:
        try:
            signal_self(signal_number)
            return 0
        finally:
            cleaned.append(True)

    assert run_command("prog", command) == code
    assert cleaned == [True]
    name = signal.Signals(signal_number).name
    assert capsys.readouterr().err == f"prog: interrupted ({name}); nothing half-written was left\n"


def test_an_interruption_inside_signals_deferred_is_raised_when_the_block_ends(capsys):
    steps = []

    def command() -> int:
        with signals_deferred():
            signal_self(signal.SIGTERM)
            steps.append("after the signal, still in the block")
        steps.append("after the block")
        return 0

    assert run_command("prog", command) == 143
    assert steps == ["after the signal, still in the block"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are given back


def test_errors_and_bad_values_are_one_line_with_their_exit_codes(capsys):
    def missing() -> int:
        raise FileNotFoundError(2, "No such file or directory", "data/x.idx")

    def bad_value() -> int:
        raise ValueError("--seq-length must be positive, got 0")

    assert run_command("prog", missing) == 1
    assert run_command("prog", bad_value) == 2
    assert run_command("prog", bad_value, value_error_exit=1) == 1
    assert capsys.readouterr().err.splitlines() == [
        "prog: error: [Errno 2] No such file or directory: 'data/x.idx'",
        "prog: error: --seq-length must be positive, got 0",
        "prog: error: --seq-length must be positive, got 0",
    ]
