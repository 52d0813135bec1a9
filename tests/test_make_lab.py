"""`make lab`, the README's first command, run as it is (the make target, not a copy of its command
line) by whoever runs the tests — root in CI — with port 8888 already held by another listener: it
must start, say why it moved and (as root) that it allows root, print the URL with its token last,
serve /lab and the quickstart notebook through the Jupyter server's API, run a kernel over Unix
sockets (no TCP warning in its terminal), and stop with everything it started when it is asked to."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid

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


def _lab_script():
    spec = importlib.util.spec_from_file_location("lab_script", os.path.join(ROOT, "scripts", "lab.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_kernel_sockets_go_in_the_runtime_dir_only_when_their_path_fits(tmp_path):
    lab = _lab_script()
    assert lab.kernel_sockets_fit("/tmp/rt")
    # jupyter_client's longest name there: kernel-<uuid>-ipc-<n>; a path past 107 bytes keeps TCP
    fits = "/" + "d" * (lab.SOCKET_PATH_MAX - len(f"/kernel-{'0' * 36}-ipc-999") - 1)
    assert lab.kernel_sockets_fit(fits) and not lab.kernel_sockets_fit(fits + "d")


def _run_in_kernel(base: str, token: str, code: str) -> str:
    """Start a kernel through the server's API and run ``code`` in it over the kernel's websocket,
    as JupyterLab does; its stdout."""
    from tornado import httpclient, ioloop, websocket

    auth = {"Authorization": f"token {token}", "Content-Type": "application/json"}
    req = urllib.request.Request(f"{base}/api/kernels", data=b'{"name": "python3"}', headers=auth,
                                 method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        kernel = json.loads(r.read().decode())["id"]

    async def run():
        ws_url = base.replace("http://", "ws://") + f"/api/kernels/{kernel}/channels"
        ws = await websocket.websocket_connect(httpclient.HTTPRequest(ws_url, headers=auth))
        msg_id = uuid.uuid4().hex
        await ws.write_message(json.dumps({
            "header": {"msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex,
                       "msg_type": "execute_request", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False}}))
        # the reply comes on the shell channel, the output on iopub: no order between the two.
        # iopub's "idle" for the request comes after every output of it.
        out, replied, idle = [], False, False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (replied and idle):
            raw = await ws.read_message()
            assert raw is not None, "the kernel's websocket closed"
            m = json.loads(raw)
            if m.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if m["msg_type"] == "stream":
                out.append(m["content"]["text"])
            elif m["msg_type"] == "execute_reply":
                assert m["content"]["status"] == "ok", m["content"]
                replied = True
            elif m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                idle = True
        ws.close()
        if not (replied and idle):
            raise AssertionError("the kernel did not answer within 60 s")
        return "".join(out)

    return ioloop.IOLoop(make_current=False).run_sync(run)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_make_lab_starts_on_a_free_port_and_serves_the_tour(tmp_path):
    held = _hold_8888()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k != "MFLAGS"}
    runtime = tempfile.mkdtemp(prefix="sk-rt-")   # short, as a home's is: its kernels' sockets fit
    env.update({
        "STATEKIT_HOME": str(tmp_path / "statekit-home"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"),
        "JUPYTER_RUNTIME_DIR": runtime,
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

        # a notebook's kernel: over Unix sockets in the runtime dir, no TCP warning in the terminal
        assert _run_in_kernel(base, token, "print(6 * 7)") == "42\n"
        socks = [f for f in os.listdir(runtime) if stat.S_ISSOCK(os.stat(os.path.join(runtime, f)).st_mode)]
        assert socks and all(re.fullmatch(r"kernel-[0-9a-f-]{36}-ipc-\d+", f) for f in socks), socks
        assert stat.S_IMODE(os.stat(runtime).st_mode) & 0o777 == 0o700   # (Jupyter adds the sticky bit)
        time.sleep(0.5)
        assert not [ln for ln in lines if "without encryption" in ln or "kernels use localhost TCP" in ln]
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
        shutil.rmtree(runtime, ignore_errors=True)
    assert not alive, "make lab left processes running after SIGTERM"
