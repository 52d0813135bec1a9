"""`make lab`, the README's first command, run as it is (the make target, not a copy of its command
line) by whoever runs the tests — root in CI — with port 8888 already held by another listener: it
must start, say why it moved and (as root) that it allows root, print the URL with its token last,
serve /lab and the quickstart notebook through the Jupyter server's API, and stop with everything it
started when it is asked to."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
URL = re.compile(r"^\s+(http://[^\s]+/lab\?token=([0-9a-f]+))\s*$")


def _hold_8888():
    """A listener on 127.0.0.1:8888 for the test's life (None when something else holds it already:
    then the port is taken anyway, which is what the test needs)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", 8888))
        s.listen(1)
        return s
    except OSError:
        s.close()
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", 8888)) == 0, "8888 is neither free nor listening"
        return None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_make_lab_starts_on_a_free_port_and_serves_the_tour(tmp_path):
    held = _hold_8888()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k != "MFLAGS"}
    env.update({
        "STATEKIT_HOME": str(tmp_path / "statekit-home"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "lab-settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "lab-workspaces"),
    })
    env.pop("DISPLAY", None)
    env.pop("WAYLAND_DISPLAY", None)
    proc = subprocess.Popen(["make", "-s", "-C", ROOT, "lab"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    found = threading.Event()

    def ours(i: int) -> bool:
        """Line i is a URL that make lab printed itself (after its "JupyterLab is running" line),
        not one of Jupyter's own banner lines."""
        before = [ln for ln in lines[:i] if ln.strip()]
        return bool(URL.match(lines[i])) and bool(before) and "JupyterLab is running" in before[-1]

    def read():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if ours(len(lines) - 1):
                found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert found.wait(120), "make lab printed no URL within 120 s:\n" + "\n".join(lines[-40:])
        url_line = next(i for i in range(len(lines)) if ours(i))
        url, token = URL.match(lines[url_line]).groups()
        port = int(re.search(r":(\d+)/", url).group(1))
        assert port != 8888
        assert any(f"port 8888 is taken; JupyterLab listens on {port}" in ln for ln in lines[:url_line])
        root_said = any("running as root, so JupyterLab starts with --allow-root" in ln for ln in lines)
        assert root_said == (os.geteuid() == 0)
        # what a person reads last at start: the URL (nothing after it but blank lines yet)
        assert not [ln for ln in lines[url_line + 1:] if ln.strip()], lines[url_line - 3:]

        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.status == 200
            assert "JupyterLab" in r.read().decode()
        base = url.split("/lab?")[0]
        req = urllib.request.Request(f"{base}/api/contents/01_quickstart.ipynb?content=1",
                                     headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            nb = json.loads(r.read().decode())
        assert nb["type"] == "notebook"
        with open(os.path.join(ROOT, "notebooks", "01_quickstart.ipynb")) as fh:
            assert nb["content"]["cells"][0]["source"] == "".join(json.load(fh)["cells"][0]["source"])
        # without the token the API refuses
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}/api/contents/01_quickstart.ipynb", timeout=30)
        assert refused.value.code == 403
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        deadline = time.monotonic() + 30
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        alive = _group_alive(proc.pid)
        if alive:
            os.killpg(proc.pid, signal.SIGKILL)
        if held is not None:
            held.close()
    assert not alive, "make lab left processes running after SIGTERM"
