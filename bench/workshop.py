"""A workshop room on this machine: N participants' kernels run notebook 01's cells at the same
moment, (a) each kernel with its own local Spark, (b) all on one shared Spark Connect server
(``statekit spark serve``'s server; the kernels get ``SPARK_REMOTE`` and nothing else changes).

    .venv/bin/python bench/workshop.py [--kernels 8] [--idle-wait S] [--idle-seconds 15]
                                       [--only local|connect]

Each participant is a real Jupyter kernel (jupyter_client) with a ``STATEKIT_HOME`` of its own
(its own embedded broker) in ``notebooks/``; the kernels are started first (a participant opens the
notebook before the teacher says go), then every kernel runs notebook 01's code cells at once, up
to its ``%statekit stop`` cell. Per kernel:

- first numbers: from the moment its first cell is sent to its app's first committed micro-batch
  with records (what the dashboard's header shows first);
- PSS: the sum of ``Pss`` (``/proc/PID/smaps_rollup``) over the kernel and every process it started
  (its broker, instances, Spark's JVM and Python workers), once every kernel is idle with its app
  running and the room is at rest (``--idle-wait``, default: until Spark has closed the Python
  planner workers of the queries' starts, a minute, as ``bench/footprint.py`` waits);
- idle CPU: the CPU those processes use over ``--idle-seconds`` then, in cores.

The room: the kernels' sums, plus the server's (its JVM and every process it started, by command)
in (b); also just after the start (a peak: the planners still open).
Then each kernel runs the rest of the notebook (stop, down) and is shut down; the server is
stopped. Goals for (b) on two cores: every first numbers ≤ 30 s, a kernel's PSS ≤ 300 MB, the room
≤ 4 GB.

Last lines:

    FIGURE name=workshop_first_numbers_max value=<s, shared server> unit=s baseline=<s, own Spark> ratio=...
    FIGURE name=workshop_kernel_pss_max value=<MB, shared> unit=MB baseline=<MB, own Spark> ratio=...
    FIGURE name=workshop_room_idle_cpu value=<cores, shared> unit=cores baseline=<cores, own> ratio=...
    FIGURE name=workshop_room_pss_at_start value=<MB, shared> unit=MB baseline=<MB, own> ratio=...
    RESULT name=workshop_room_pss value=<MB, shared server> unit=MB baseline=<MB, own Spark> ratio=...
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

_TICK = os.sysconf("SC_CLK_TCK")
NOTEBOOK = os.path.join(ROOT, "notebooks", "01_quickstart.ipynb")
PROBE = ("import json, kernel_ext\n"
         "_a = kernel_ext.session().apps['wordcount']\n"
         "_c = [e.ts for e in _a.events(types='commit') if e.records]\n"
         "print('FIRST', json.dumps(min(_c) if _c else None))")


def say(msg: str) -> None:
    print(msg, flush=True)


# -- /proc ----------------------------------------------------------------------------------------------

def tree(root: int) -> list:
    """`root` and every process it started, transitively (from /proc)."""
    from statekit.engine.spark.procs import descendants

    return [root, *descendants(root)]


def pss_mb(pids) -> float:
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for ln in f:
                    if ln.startswith("Pss:"):
                        total += int(ln.split()[1])
                        break
        except (OSError, ValueError, IndexError):
            pass
    return total / 1024


def _words(pid: int) -> list:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _name(pid: int) -> str:
    words = _words(pid)
    mod = next((words[i + 1] for i, w in enumerate(words[:-1]) if w == "-m"), None)
    return mod or os.path.basename(words[0]) if words else "?"


def _kind(pid: int) -> str:
    step = next((w for w in _words(pid) if w.startswith("pyspark.sql.worker.")), None)
    return f"{_name(pid)} {step[len('pyspark.sql.worker.'):]}" if step else _name(pid)


def _by_kind(pids, measure=None) -> list:
    """[(PSS MB, or ``measure``'s sum, name, count)] of ``pids`` grouped by command, largest
    first."""
    kinds: dict = {}
    for q in pids:
        total, n = kinds.get(_kind(q), (0.0, 0))
        kinds[_kind(q)] = (total + (measure or pss_mb)([q]), n + 1)
    return sorted(((round(v, 1), name, n) for name, (v, n) in kinds.items()), reverse=True)


def cpu_seconds(pids) -> float:
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        except (OSError, ValueError, IndexError):
            pass
    return total / _TICK


# -- the kernels ----------------------------------------------------------------------------------------

def cells() -> tuple:
    """Notebook 01's code cells: (up to its `%statekit stop` cell, from there on)."""
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    cut = next(i for i, c in enumerate(code) if c.strip().startswith("%statekit stop"))
    return code[:cut], code[cut:]


def run(kc, code: str, timeout: float = 1800) -> dict:
    out = {"stdout": "", "error": None}

    def hook(msg):
        t, c = msg["msg_type"], msg["content"]
        if t == "stream" and c["name"] == "stdout":
            out["stdout"] += c["text"]
        elif t == "error":
            out["error"] = f"{c['ename']}: {c['evalue']}"

    kc.execute_interactive(code, output_hook=hook, timeout=timeout)
    return out


class Participant:
    def __init__(self, i: int, work: str, remote: str | None):
        self.i = i
        self.home = os.path.join(work, f"participant-{i}")
        os.makedirs(self.home, exist_ok=True)
        self.remote = remote
        self.km = self.kc = None
        self.result: dict = {}
        self.said: list = []

    def start(self) -> None:
        from jupyter_client.manager import start_new_kernel

        env = dict(os.environ, STATEKIT_HOME=self.home, PYSPARK_PYTHON=sys.executable,
                   PYSPARK_DRIVER_PYTHON=sys.executable)
        for k in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_API_MODE", "STATEKIT_SPARK_MASTER",
                  "STATEKIT_BOOTSTRAP"):
            env.pop(k, None)
        if self.remote:
            env["SPARK_REMOTE"] = self.remote
        self.km, self.kc = start_new_kernel(kernel_name="python3", env=env,
                                            cwd=os.path.join(ROOT, "notebooks"))

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def first_part(self, code: list, go: threading.Event) -> None:
        go.wait()
        t0 = time.time()
        try:
            for c in code:
                got = run(self.kc, c)
                self.said.append((c, got["stdout"]))
                if got["error"]:
                    said = " | ".join(out.strip()[-300:] for _c, out in self.said[-4:])
                    raise RuntimeError(f"participant {self.i}: {got['error']} in {c[:60]!r} "
                                       f"(said before: {said})")
            probe = run(self.kc, PROBE)
            first = json.loads(probe["stdout"].split("FIRST ", 1)[1].split("\n", 1)[0])
            self.result.update(first_numbers=(first - t0) if first else float("nan"),
                               cells_s=time.time() - t0)
        except Exception as exc:  # noqa: BLE001 - said by the bench
            self.result["error"] = str(exc)

    def rest(self, code: list) -> None:
        for c in code:
            run(self.kc, c)

    def shutdown(self) -> None:
        from statekit import broker as broker_mod

        if self.kc is not None:
            self.kc.stop_channels()
        if self.km is not None:
            self.km.shutdown_kernel(now=True)
        broker_mod.stop(os.path.join(self.home, "broker"))   # its own session: not the kernel's


def room(n: int, work: str, idle_s: float, remote: str | None, server_pid: int | None,
         idle_wait: float) -> dict:
    first, rest = cells()
    people = [Participant(i, work, remote) for i in range(n)]
    try:
        for p in people:
            p.start()
        go = threading.Event()
        threads = [threading.Thread(target=p.first_part, args=(first, go)) for p in people]
        for t in threads:
            t.start()
        go.set()
        for t in threads:
            t.join()
        errors = [p.result["error"] for p in people if "error" in p.result]
        if errors:
            for e in errors[1:]:
                say(f"also: {e}")
            raise RuntimeError(f"{len(errors)} of {n} participants failed; the first: {errors[0]}")
        time.sleep(2)                        # the last kernel's cell has just returned
        # the room just after the start: Spark still holds the Python planners every query's start
        # used, until its idle timeout closes them (a minute): a peak, not what the room pays
        started = (sum(pss_mb(tree(p.pid)) for p in people)
                   + (pss_mb(tree(server_pid)) if server_pid else 0.0))
        everyone = [q for p in people for q in tree(p.pid)] + (tree(server_pid) if server_pid else [])
        start_cpu = _by_kind(everyone, cpu_seconds)   # (of the processes still alive)
        time.sleep(idle_wait)
        trees = {p.i: tree(p.pid) for p in people}
        server = tree(server_pid) if server_pid else []
        cpu0 = {i: cpu_seconds(t) for i, t in trees.items()}
        s0 = cpu_seconds(server)
        time.sleep(idle_s)
        trees = {p.i: tree(p.pid) for p in people}
        server = tree(server_pid) if server_pid else []
        for p in people:
            p.result["pss_by_process"] = sorted(((round(pss_mb([q]), 1), _name(q)) for q in trees[p.i]),
                                                reverse=True)
            p.result["pss_mb"] = pss_mb(trees[p.i])
            p.result["idle_cpu"] = (cpu_seconds(trees[p.i]) - cpu0[p.i]) / idle_s
            p.result["processes"] = len(trees[p.i])
        out = {"kernels": [p.result for p in people],
               "server_pss_mb": pss_mb(server), "server_idle_cpu": (cpu_seconds(server) - s0) / idle_s,
               "server_processes": len(server), "server_by_kind": _by_kind(server),
               "room_pss_at_start_mb": started, "start_cpu_by_kind": start_cpu}
        out["room_pss_mb"] = sum(r["pss_mb"] for r in out["kernels"]) + out["server_pss_mb"]
        out["room_idle_cpu"] = sum(r["idle_cpu"] for r in out["kernels"]) + out["server_idle_cpu"]
        threads = [threading.Thread(target=p.rest, args=(rest,)) for p in people]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out
    finally:
        for p in people:
            p.shutdown()


def report(name: str, r: dict) -> None:
    for i, k in enumerate(r["kernels"]):
        say(f"{name}, participant {i}: first numbers {k['first_numbers']:.1f} s, PSS "
            f"{k['pss_mb']:.0f} MB ({k['processes']} processes), idle CPU {k['idle_cpu']:.3f} cores")
    biggest = max(r["kernels"], key=lambda k: k["pss_mb"])
    say(f"{name}, the largest kernel's processes (PSS MB): "
        + ", ".join(f"{n} {m:.0f}" for m, n in biggest["pss_by_process"]))
    if r.get("server_by_kind"):
        say(f"{name}, the server's processes (PSS MB, by command): "
            + ", ".join(f"{k} {m:.0f} ({n})" for m, k, n in r["server_by_kind"]))
    say(f"{name}, the room's start, CPU s by command (live processes): "
        + ", ".join(f"{k} {c:.1f} ({n})" for c, k, n in r["start_cpu_by_kind"][:8]))
    say(f"{name}, the room: PSS {r['room_pss_at_start_mb']:,.0f} MB just after the start, at rest "
        f"{r['room_pss_mb']:,.0f} MB (server {r['server_pss_mb']:.0f} MB, "
        f"{r['server_processes']} processes), idle CPU {r['room_idle_cpu']:.3f} cores, first numbers "
        f"max {max(k['first_numbers'] for k in r['kernels']):.1f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=8)
    ap.add_argument("--idle-seconds", type=float, default=15.0)
    ap.add_argument("--idle-wait", type=float, default=None,
                    help="seconds at rest before measuring (default: until Spark has closed the "
                         "Python planners of the queries' starts, as bench/footprint.py)")
    ap.add_argument("--master", default="local[4]", help="the shared server's master")
    ap.add_argument("--only", choices=("local", "connect"), default=None,
                    help="run one of the two rooms (no RESULT line: it compares both)")
    args = ap.parse_args(argv)
    from statekit.engine.spark.connect_server import ConnectServer
    from statekit.engine.spark.session import PYTHON_WORKER_IDLE_S

    if args.idle_wait is None:
        args.idle_wait = PYTHON_WORKER_IDLE_S + 15

    work = tempfile.mkdtemp(prefix="statekit-bench-workshop-")
    results = {}
    try:
        if args.only != "connect":
            say(f"(a) {args.kernels} kernels, each with its own local Spark")
            results["local"] = room(args.kernels, os.path.join(work, "local"), args.idle_seconds, None, None,
                                    args.idle_wait)
            report("own Spark", results["local"])
        if args.only == "local":
            shutil.rmtree(work, ignore_errors=True)
            return 0
        say(f"(b) {args.kernels} kernels on one Spark Connect server ({args.master})")
        t = time.perf_counter()
        server = ConnectServer(os.path.join(work, "server"), master=args.master).start()
        say(f"the server is up at {server.url} in {time.perf_counter() - t:.1f} s (the teacher's, "
            f"before the room starts)")
        try:
            results["connect"] = room(args.kernels, os.path.join(work, "connect"), args.idle_seconds,
                                      server.url, server.pid, args.idle_wait)
        finally:
            server.stop()
        report("shared server", results["connect"])
        if args.only == "connect":
            shutil.rmtree(work, ignore_errors=True)
            return 0
        a, b = results["local"], results["connect"]
        fa = max(k["first_numbers"] for k in a["kernels"])
        fb = max(k["first_numbers"] for k in b["kernels"])
        pa = max(k["pss_mb"] for k in a["kernels"])
        pb = max(k["pss_mb"] for k in b["kernels"])
        say(f"goals (b): first numbers <= 30 s: {fb:.1f} s; a kernel's PSS <= 300 MB: {pb:.0f} MB; "
            f"the room <= 4 GB: {b['room_pss_mb'] / 1024:.2f} GB")
        say(f"FIGURE name=workshop_first_numbers_max value={fb:.2f} unit=s baseline={fa:.2f} "
            f"ratio={fb / fa:.3f}")
        say(f"FIGURE name=workshop_kernel_pss_max value={pb:.0f} unit=MB baseline={pa:.0f} "
            f"ratio={pb / pa:.3f}")
        say(f"FIGURE name=workshop_room_idle_cpu value={b['room_idle_cpu']:.3f} unit=cores "
            f"baseline={a['room_idle_cpu']:.3f} ratio={b['room_idle_cpu'] / max(a['room_idle_cpu'], 1e-9):.3f}")
        say(f"FIGURE name=workshop_room_pss_at_start value={b['room_pss_at_start_mb']:.0f} unit=MB "
            f"baseline={a['room_pss_at_start_mb']:.0f} "
            f"ratio={b['room_pss_at_start_mb'] / a['room_pss_at_start_mb']:.3f}")
        say(f"RESULT name=workshop_room_pss value={b['room_pss_mb']:.0f} unit=MB "
            f"baseline={a['room_pss_mb']:.0f} ratio={b['room_pss_mb'] / a['room_pss_mb']:.3f}")
    except BaseException:
        say(f"kept for a look: {work} (each participant's STATEKIT_HOME)")
        raise
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
