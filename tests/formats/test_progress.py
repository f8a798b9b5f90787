"""The reading progress bar: automatic only on a terminal (no carriage returns in logs), forced on request."""

import io
import sys

from graphmon.formats import read
from graphmon.formats.read import read_trace

from helpers import KINETO


class _Tty(io.StringIO):
    def isatty(self):
        return True


def _auto_bar_at_once(monkeypatch):
    # the automatic bar, with no size floor and no delay, so that reading the small test file would draw it
    monkeypatch.setattr(read, "_PROGRESS_MIN_BYTES", 0)
    monkeypatch.setattr(read, "_PROGRESS_DELAY_S", 0.0)


def test_automatic_bar_stays_out_of_a_non_tty_log(monkeypatch, capsys):
    _auto_bar_at_once(monkeypatch)
    assert len(read_trace(KINETO)) > 0
    assert "\r" not in capsys.readouterr().err


def test_automatic_bar_on_a_terminal_and_forced_bar_anywhere(monkeypatch, capsys):
    _auto_bar_at_once(monkeypatch)
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    read_trace(KINETO)
    assert "\r" in tty.getvalue()
    monkeypatch.undo()
    read_trace(KINETO, progress=True)  # explicit opt-in (analyze --progress) draws into a log too
    assert "\r" in capsys.readouterr().err
