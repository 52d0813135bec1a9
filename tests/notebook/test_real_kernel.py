"""In a real Jupyter kernel (ipykernel, driven by jupyter_client): an error raised by a Python cell
shows as one red line (IPython does not show what a custom exception handler returns); and a kernel
that ends without `%statekit down` leaves no process statekit started — the embedded broker of
`%statekit up`, Spark's JVM, the app's instance processes and the spares — checked by pid after a
SIGKILL of the kernel (nothing of it runs: no atexit, no finally) and after a shutdown as
JupyterLab's restart does it, where the dashboard says its app is gone (not RUNNING)."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from statekit.broker.process import pid_alive
from tests.waiting import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PIDS = """
import json, kernel_ext
from statekit.runtime import supervisor
from statekit.engine.spark_native.engine import jvm_pid
_s = kernel_ext.session()
print(json.dumps({"broker": _s.broker.pid, "registry": _s.registry.pid,
                  "jvm": jvm_pid() if _s.spark is not None else None,
                  "instances": [int(p) for p in app.instances_frame()["pid"] if p],
                  "spares": [sp.pid for sp in supervisor.SPARES._spares if sp.poll() is None]}))
"""


STACKS = """
import faulthandler, signal
faulthandler.register(signal.SIGUSR1, file=open({path!r}, "w"), all_threads=True)
"""


def _silent(kc, timeout: float) -> str:
    """What a kernel that sent nothing for ``timeout`` seconds was doing: every thread's stack
    (faulthandler, registered by the fixture on SIGUSR1), for the failure's message."""
    path = getattr(kc, "stacks_path", None)
    pid = getattr(kc, "kernel_pid", None)
    if pid is None or not pid_alive(pid):
        return f"the kernel sent nothing for {timeout:.0f} s: it is no longer alive"
    os.kill(pid, signal.SIGUSR1)
    time.sleep(2)
    with open(path) as f:
        return f"the kernel sent nothing for {timeout:.0f} s; its threads:\n{f.read()[-12000:]}"


def _run(kc, code: str, timeout: float = 300.0, errors: list | None = None) -> str:
    """Run a cell; its stdout (a cell that fails fails the test with its output, unless `errors`
    collects the tracebacks it shows)."""
    import queue

    msg_id = kc.execute(code)
    out, err = [], []
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            raise AssertionError(_silent(kc, timeout)) from None
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, c = msg["msg_type"], msg["content"]
        if kind == "stream":
            (out if c["name"] == "stdout" else err).append(c["text"])
        elif kind == "error":
            if errors is None:
                raise AssertionError(f"{c['ename']}: {c['evalue']}")
            errors.append(c["traceback"])
        elif kind == "status" and c["execution_state"] == "idle":
            break
    assert not err, "".join(err)
    return "".join(out)


@pytest.fixture
def kernel(tmp_path):
    from jupyter_client.manager import KernelManager

    env = dict(os.environ, STATEKIT_HOME=str(tmp_path / "home"),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("STATEKIT_BOOTSTRAP", None)
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=env, cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    kc.kernel_pid, kc.stacks_path = km.provisioner.pid, str(tmp_path / "kernel-stacks.txt")
    _run(kc, STACKS.format(path=kc.stacks_path))
    try:
        yield km, kc
    finally:
        kc.stop_channels()
        if km.is_alive():
            km.shutdown_kernel(now=True)


def _start_an_app(kc, spark: bool) -> dict:
    _run(kc, "%load_ext kernel_ext\n%statekit up" + ("" if spark else " --no-spark"))
    _run(kc, "%statekit produce words --generator words --seed 2 --limit 100 --partitions 2 --wait")
    _run(kc, "%%statekit app ex --engine local --partitions 2 --instances 2\n"
             "app.stream('words', value_serde='json').group_by_key().count(store='c')\n")
    _run(kc, "%statekit start ex --watch\n%statekit wait ex")
    pids = json.loads(_run(kc, PIDS).strip().splitlines()[-1])
    deadline = time.monotonic() + 40
    while not pids["spares"] and time.monotonic() < deadline:   # the spare taken is replaced
        time.sleep(0.5)                                          # once the machine is quiet
        pids = json.loads(_run(kc, PIDS).strip().splitlines()[-1])
    everything = [pids["broker"], pids["registry"], *pids["instances"], *pids["spares"]] + \
        ([pids["jvm"]] if spark else [])
    assert len(pids["instances"]) == 2 and pids["spares"] and (pids["jvm"] or not spark)
    assert all(pid_alive(p) for p in everything), pids
    return {"pids": pids, "all": everything}


def test_an_error_raised_in_a_python_cell_shows_as_its_one_red_line(kernel):
    _km, kc = kernel
    shown: list = []
    _run(kc, "%load_ext kernel_ext\nfrom statekit.errors import StatekitError\n"
             "raise StatekitError('app bank is not started: start it first')", errors=shown)
    _run(kc, "print(died)", errors=shown)
    assert shown == [["\x1b[31mStatekitError: app bank is not started: start it first\x1b[0m"],
                     ["\x1b[31mNameError: name 'died' is not defined: a cell above sets it; run the cells "
                      "above this one first (or check the spelling)\x1b[0m"]]


def test_a_kernel_killed_without_down_leaves_no_statekit_process(kernel):
    km, kc = kernel
    started = _start_an_app(kc, spark=True)
    os.kill(km.provisioner.pid, signal.SIGKILL)
    wait_until(lambda: not km.is_alive(), 10, "the kernel to die")
    wait_until(lambda: not [p for p in started["all"] if pid_alive(p)], 30,
               f"every process of {started['pids']} to end")


def test_a_kernel_shut_down_without_down_says_so_on_the_dashboard_and_leaves_no_process(kernel):
    km, kc = kernel
    started = _start_an_app(kc, spark=False)
    km.request_shutdown(restart=True)   # what JupyterLab's "restart kernel" sends first
    said = []
    try:
        while True:   # the dashboard's last updates, until the kernel closed its channel
            msg = kc.get_iopub_msg(timeout=10)
            if msg["msg_type"] == "comm_msg":
                said.append(json.dumps(msg["content"].get("data", {}).get("state", {})))
    except Exception:   # queue.Empty: the kernel is gone
        pass
    wait_until(lambda: not km.is_alive(), 20, "the kernel to exit")
    assert any("the kernel stopped: app ex and the processes it started are gone" in s for s in said)
    assert any(">NOT_RUNNING<" in s for s in said)
    wait_until(lambda: not [p for p in started["all"] if pid_alive(p)], 30,
               f"every process of {started['pids']} to end")
