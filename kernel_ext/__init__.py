"""statekit's IPython extension: `%load_ext kernel_ext`, then `%statekit --help`.

One line magic (`%statekit SUBCOMMAND ...`) and one cell magic (`%%statekit app NAME`), both thin
parsers over the statekit Python API; the live dashboard lives in `kernel_ext.dashboard`.
"""
from __future__ import annotations

_magics = None
_atexit_registered = False


def load_ipython_extension(ip):
    global _magics, _atexit_registered
    from kernel_ext.magics import StatekitMagics, complete

    _magics = StatekitMagics(ip)
    ip.register_magics(_magics)
    if not _atexit_registered:
        import atexit

        atexit.register(_at_exit)
        _watch_shutdown_request(getattr(ip, "kernel", None))
        _atexit_registered = True
    try:
        ip.set_hook("complete_command", lambda _self, event: complete(ip, event), str_key="%statekit")
    except Exception:  # completion is a nicety
        pass


def _at_exit() -> None:
    """The kernel exits (a restart, a shutdown): the dashboards say their apps are gone. Registered
    after ipykernel's own exit handlers, so it runs before they close the channel the dashboards
    are drawn through."""
    if _magics is not None:
        _magics.session.at_exit()


def _watch_shutdown_request(kernel) -> None:
    """A restart or shutdown from the frontend: the apps stop before ipykernel ends the kernel's
    children. ipykernel signals every child in its process group until none is left, for up to
    half a minute; an app still running would replace what it kills, and a child nobody reaped
    would stay on its list."""
    original = getattr(kernel, "do_shutdown", None)
    if original is None:
        return

    async def do_shutdown(restart):
        if _magics is not None:
            _stop_before_shutdown(_magics.session)
        result = original(restart)
        return await result if hasattr(result, "__await__") else result

    kernel.do_shutdown = do_shutdown


def _stop_before_shutdown(session) -> None:
    """Producers and apps stop (their dashboards stay, to say so) and the spare process ends."""
    from statekit.runtime import supervisor

    session.stop_producers_and_apps()
    supervisor.close_spares()


def unload_ipython_extension(ip):
    global _magics
    if _magics is not None:
        for d in list(_magics.session.dashboards.values()):
            d.stop(timeout=3)
        for job in list(_magics.session.producers.values()):
            job.stop.set()
        ip.set_custom_exc((), None)
    _magics = None


def session():
    """The kernel's `Session` (apps by name, the broker, producers, dashboards)."""
    if _magics is None:
        raise RuntimeError("load the extension first: %load_ext kernel_ext")
    return _magics.session


def last_traceback() -> None:
    """Print the full traceback of the last internal error (for bug reports)."""
    tb = _magics.session.last_traceback if _magics is not None else None
    print(tb or "no internal error so far")
