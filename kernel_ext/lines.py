"""How `%statekit` speaks in a notebook: one write per line, red one-line errors, and an app's
failure said once, where it can be seen.

A line is written with its newline in one `write`, so a line from the app's event thread never runs
into a line of the cell ("…follows it)bank: instance 0 crashed…"). ipykernel sends a thread's output
to the cell that runs, or ran last: when that cell is the one showing the app's dashboard, a failure
printed there would land below the dashboard, out of sight, so it goes to a notice line above the
dashboard instead. The same failure reaches the kernel several ways (the event thread, the command
that waited, the exception of a cell): `Voice.claim` lets the first one say it and the others not.
"""
from __future__ import annotations

import html
import sys
import threading

RED, RESET = "\x1b[31m", "\x1b[0m"


def one_line(text) -> str:
    return " ".join(str(text).split())


def say(text: str) -> None:
    """Print one line to the cell (text and newline in one write)."""
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


def error_line(message) -> None:
    """Print one red line to the cell's stderr."""
    sys.stderr.write(f"{RED}{one_line(message)}{RESET}\n")
    sys.stderr.flush()


def current_cell() -> str | None:
    """The id of the request whose cell output goes to now (ipykernel only; None elsewhere)."""
    header = getattr(sys.stdout, "parent_header", None)
    if not isinstance(header, dict):
        return None
    return header.get("msg_id") or (header.get("header") or {}).get("msg_id")


class Notice:
    """A line above an app's dashboard, in the dashboard's cell; empty (and hidden) until used."""

    def __init__(self, cell: str | None):
        import ipywidgets as W

        self.cell = cell
        self.widget = W.HTML(value="", layout=W.Layout(display="none"))

    def show(self, text: str) -> None:
        self.widget.value = (f"<div class='statekit-notice' style='color:#c62828;font-family:monospace;font-size:12.5px;"
                             f"white-space:pre-wrap'>{html.escape(one_line(text))}</div>")
        self.widget.layout.display = ""

    def clear(self) -> None:
        self.widget.value = ""
        self.widget.layout.display = "none"


class Voice:
    """What the session has said about each app's failures, and where a failure line goes."""

    def __init__(self):
        self._lock = threading.Lock()
        self._said: dict[str, str] = {}       # app name -> the failure already said
        self.notices: dict[str, Notice] = {}  # app name -> the notice above its dashboard

    def claim(self, name: str, reason) -> bool:
        """True for the first caller that wants to say this failure of app `name`."""
        reason = one_line(reason)
        with self._lock:
            if self._said.get(name) == reason:
                return False
            self._said[name] = reason
            return True

    def said(self, reason) -> bool:
        """Whether some app's failure with this reason was said already."""
        reason = one_line(reason)
        with self._lock:
            return any(reason and (reason == r or reason in r) for r in self._said.values())

    def forget(self, name: str) -> None:
        """The app starts again: its next failure is news."""
        with self._lock:
            self._said.pop(name, None)
        n = self.notices.get(name)
        if n is not None:
            n.clear()

    def failure(self, name: str, text: str) -> None:
        """Say an app's failure line: above its dashboard when the cell it would land in is the
        dashboard's own (below the dashboard nobody sees it), else under the cell."""
        n = self.notices.get(name)
        cell = current_cell()
        if n is not None and cell is not None and cell == n.cell:
            n.show(text)
        else:
            error_line(text)
