"""IPython glue: `%statekit` (line) and `%%statekit` (cell) parse with `kernel_ext.parser` and run
with `kernel_ext.commands.Session`. A user mistake prints one red line on stderr, never a stack trace."""
from __future__ import annotations

import traceback

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from kernel_ext.commands import Session
from kernel_ext.lines import RED, RESET, error_line, one_line
from kernel_ext.parser import Help, ParseError, parse, subcommand_names

__all__ = ["StatekitMagics", "complete", "error_line", "one_line_errors"]


def _in_the_cell_itself(shell, tb) -> bool:
    """The exception was raised by the cell's own top-level code (not inside a function it called)."""
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    cells = getattr(getattr(shell, "compile", None), "_filename_map", None) or {}
    code = tb.tb_frame.f_code if tb is not None else None
    return code is not None and code.co_name == "<module>" and code.co_filename in cells


def one_line_errors(shell, session) -> None:
    """A `StatekitError` raised in any cell (`app.process_all_available()`, `app.crash(...)`) shows
    as its one line, in red, instead of a traceback (kept for `kernel_ext.last_traceback()`); the
    cell still fails, so "run all" stops there as before. So does a NameError of a cell's own code:
    a notebook's cell run before the cell above it that sets the name."""
    from statekit.errors import StatekitError

    def handler(_shell, etype, value, tb, tb_offset=None):
        # IPython never shows what a custom handler returns (ipython/ipython#12378): it is shown
        # here, and nothing is returned (so that a fixed IPython would not show it twice)
        if issubclass(etype, NameError) and not _in_the_cell_itself(shell, tb):
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
            return None
        session.last_traceback = "".join(traceback.format_exception(etype, value, tb))
        if issubclass(etype, NameError):
            line = (f"NameError: {one_line(value)}: a cell above sets it; run the cells above this one "
                    f"first (or check the spelling)")
        else:
            for name, app in list(session.apps.items()):   # an app's failure: said here, not again
                if getattr(app, "error", None) is not None and one_line(app.error) == one_line(value):
                    session.voice.claim(name, value)
            line = f"{etype.__name__}: {one_line(value)}"
        shell._showtraceback(etype, value, [f"{RED}{line}{RESET}"])
        return None

    shell.set_custom_exc((StatekitError, NameError), handler)


@magics_class
class StatekitMagics(Magics):
    def __init__(self, shell):
        super().__init__(shell)
        self.session = Session(shell)
        one_line_errors(shell, self.session)

    def _run(self, line: str, cell: str | None):
        from statekit.errors import StatekitError

        try:
            cmd = parse(line, cell)
        except ParseError as err:
            error_line(err)
            return None
        if isinstance(cmd, Help):
            print(cmd.text.rstrip())
            return None
        try:
            return self.session.run(cmd)
        except (StatekitError, ParseError) as err:
            if not self.session.voice.said(err):   # an app's failure the kernel said already
                error_line(f"%statekit {cmd.command}: {err}")
        except KeyboardInterrupt:
            error_line(f"%statekit {cmd.command}: interrupted")
        except Exception as err:  # a bug, not a user mistake: still one line, details kept
            self.session.last_traceback = traceback.format_exc()
            error_line(f"%statekit {cmd.command}: {type(err).__name__}: {err} "
                       f"(details: kernel_ext.last_traceback())")
        return None

    @line_magic("statekit")
    def statekit_line(self, line: str = ""):
        """%statekit SUBCOMMAND ... — `%statekit --help` lists the subcommands."""
        return self._run(line, None)

    @cell_magic("statekit")
    def statekit_cell(self, line: str = "", cell: str = ""):
        """%%statekit app NAME [--partitions N] [--instances N] [--standby N] — the cell body builds
        the topology with `app` bound to a new statekit.App."""
        return self._run(line, cell)


def complete(shell, event):
    """Tab completion for `%statekit`: subcommands, then app names."""
    parts = event.line.split()
    magics = shell.magics_manager.registry.get("StatekitMagics")
    apps = sorted(magics.session.apps) if magics is not None else []
    if len(parts) <= 1 or (len(parts) == 2 and not event.line.endswith(" ")):
        return list(subcommand_names())
    return apps + ["--help"]
