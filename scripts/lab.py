"""`make lab`: JupyterLab on notebooks/, for root and non-root users alike.

Jupyter refuses to run as root without `--allow-root`, and many of the machines a workshop runs on
(containers, cloud notebooks, throwaway VMs, CI) are root: we pass it and say so in one line. Port
8888 is Jupyter's, but a second server, another user's or a forgotten one, often holds it: we take
the first free port from 8888 on and say so. With no display there is no browser to open. The
token is Jupyter's own, read from the server's runtime file (mode 0600), never put on a command
line where `ps` would show it to other users; the URL with its token is printed last, once the
server answers, where a person looks. Kernels talk to the server over Unix sockets in Jupyter's
runtime directory (mode 0700), not localhost TCP ports: on a shared workshop machine no other user
can subscribe to a kernel's outputs, and ipykernel's warning about unencrypted TCP stays out of the
terminal. A runtime directory too deep for a socket's path keeps TCP, and says so.

    python scripts/lab.py [--notebook-dir DIR] [extra jupyter lab arguments...]
"""
from __future__ import annotations

import errno
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIRST_PORT = 8888
PORTS_TRIED = 100


def port_free(port: int) -> bool:
    """Whether JupyterLab could listen on ``port`` of localhost: free on 127.0.0.1 and, where this
    machine has IPv6, on ::1 too (Jupyter's default ip, `localhost`, listens on both)."""
    for family, addr in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 here
        try:
            # as tornado binds: a port whose old connections linger in TIME_WAIT is free
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((addr, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return False
            if family == socket.AF_INET:
                return False
        finally:
            s.close()
    return True


def pick_port(first: int = FIRST_PORT) -> int:
    for port in range(first, first + PORTS_TRIED):
        if port_free(port):
            return port
    raise SystemExit(f"make lab: ports {first}-{first + PORTS_TRIED - 1} are all taken; "
                     f"free one, or run `make lab LAB_ARGS=--port=NNNN`")


def has_display() -> bool:
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def runtime_dir() -> str:
    from jupyter_core.paths import jupyter_runtime_dir

    return jupyter_runtime_dir()


SOCKET_PATH_MAX = 107   # a Unix socket's path, in bytes (sun_path less its NUL)


def kernel_sockets_fit(rt: str) -> bool:
    """Whether a kernel's Unix sockets fit in ``rt``: jupyter_client names them after the
    kernel's connection file, ``<rt>/kernel-<uuid>-ipc-<n>`` (n from 1, counting past any left)."""
    longest = os.path.join(os.path.abspath(rt), f"kernel-{'0' * 36}-ipc-999")
    return os.name == "posix" and len(os.fsencode(longest)) <= SOCKET_PATH_MAX


def server_info(pid: int) -> dict | None:
    """The runtime file the server with ``pid`` writes once it listens (url, port, token)."""
    for path in glob.glob(os.path.join(runtime_dir(), f"jpserver-{pid}.json")):
        try:
            with open(path) as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return None  # being written
    return None


def answers(url: str) -> bool:
    """Whether the server answers HTTP yet: it prints its own banner of URLs just before its loop
    starts serving, so our line, printed after the first answer, comes after that banner."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/api", timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def main(argv: list[str]) -> int:
    nbdir = os.path.join(ROOT, "notebooks")
    extra = list(argv)
    if "--notebook-dir" in extra:
        i = extra.index("--notebook-dir")
        nbdir = extra[i + 1]
        del extra[i:i + 2]
    # no scan for language servers: the tour needs none, and its log line would come after ours
    args = [sys.executable, "-m", "jupyter", "lab", f"--notebook-dir={nbdir}",
            "--LanguageServerManager.autodetect=False"]
    if not any(a.startswith("--port") for a in extra):
        port = pick_port()
        if port != FIRST_PORT:
            print(f"make lab: port {FIRST_PORT} is taken; JupyterLab listens on {port}", flush=True)
        args += [f"--port={port}", "--ServerApp.port_retries=0"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        print("make lab: running as root, so JupyterLab starts with --allow-root", flush=True)
        args.append("--allow-root")
    if not has_display():
        args.append("--no-browser")
    if kernel_sockets_fit(runtime_dir()):
        args.append("--KernelManager.transport=ipc")
    else:
        print(f"make lab: kernels use localhost TCP: Jupyter's runtime directory is too deep for "
              f"Unix sockets ({runtime_dir()}); set JUPYTER_RUNTIME_DIR to a shorter one", flush=True)
    args += extra
    proc = subprocess.Popen(args)

    def forward(signum, _frame):
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    # Ctrl-C in the terminal reaches JupyterLab directly (same process group) and it asks for
    # confirmation there; we wait for it rather than die under it. A SIGTERM sent to us alone
    # (a supervisor, a test) is passed on.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, forward)
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        info = server_info(proc.pid)
        if info and info.get("url") and answers(info["url"]):
            url = info["url"].rstrip("/") + "/lab"
            if info.get("token"):
                url += f"?token={info['token']}"
            print(f"\nJupyterLab is running. Open this URL in your browser "
                  f"(Ctrl-C here stops it):\n\n    {url}\n", flush=True)
            break
        time.sleep(0.2)
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
