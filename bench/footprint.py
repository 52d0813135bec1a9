"""What a started app costs a shared server, and how soon it shows its first output: the memory
(PSS) and idle CPU of a kernel and of every process it started, and its cold launch, against the
same figures for a one-process Kafka client app measured in the same run (the floor a Python
process pays).

    .venv/bin/python bench/footprint.py [--instances 2] [--records 20000] [--seconds 20]
                                        [--idle-wait S] [--launches 3]

The kernel is a fresh Python process (a notebook kernel's stand-in: no Jupyter, no JVM yet). It does
what a learner's notebook does: starts the embedded broker and the schema registry beside it (as
`%statekit up` does), produces `--records` records, defines a count over them with `--instances`
instances and calls `App.start()`. Cold launch: `App.start()` to the first micro-batch committed
with records (its `commit` event), the JVM's start included; with its CPU seconds (every process
of the kernel's tree, those that ended too). A launch varies by ~±0.4 s here from one run to the
next: `--launches` (3) fresh kernels each launch once, and the figure is their median (a launch
that went through spark-submit, the first in a venv, is said: `engine.spark.jvm_launch`). The app catches up, idles `--idle-wait` seconds
(default: until Spark has ended its idle Python workers, `session.PYTHON_WORKER_IDLE_S`), and this
process samples /proc over `--seconds`: CPU (utime + stime of every process of the kernel's tree,
transitively, in cores) and memory (the sum of `Pss` from /proc/PID/smaps_rollup: a page shared by
n processes counts 1/n in each, so the sum is what the tree costs the machine; RSS summed, which
counts shared pages once per process, beside it). Each process is named by its role (the JVM,
Spark's Python daemon and workers, the source runner, data source planners, instances, the spare,
the broker, the registry), right after the first output and idle. Then one record is sent to the
idle app and the time until its count is queryable is printed, and a second app is started in the
same kernel (the warm launch: the JVM up, as after `%statekit up`).

The floor, in the same run, against a broker of its own: a fresh Python process with a
confluent-kafka consumer (librdkafka) that counts the same records' keys into rocksdict and
commits its offsets, in one process (what Quix Streams and most hand-written apps are). Its launch
is from its spawn (imports included) to its first record counted.

Timings depend on how busy the machine is: the load average is printed with them.

Last lines:

    FIGURE name=footprint_idle_cpu value=<cores> unit=cores baseline=<client cores> ratio=...
    FIGURE name=footprint_cold_launch value=<median s> unit=s baseline=<client s> ratio=...
    RESULT name=footprint_pss value=<MB> unit=MB baseline=<client MB> ratio=...
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

_TICK = os.sysconf("SC_CLK_TCK")
PARTITIONS = 4


# -- /proc ------------------------------------------------------------------------------------------

def tree(root: int) -> list:
    """`root` and every process it started, transitively (from /proc)."""
    from statekit.engine.spark.procs import descendants

    return [root, *descendants(root)]


def cpu_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return 0


def memory_kb(pid: int) -> tuple:
    """(PSS, RSS) of one process in kB (0, 0 when it is gone)."""
    pss = rss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
                elif line.startswith("Rss:"):
                    rss = int(line.split()[1])
    except OSError:
        pass
    return pss, rss


def cmdline(pid: int) -> list:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def role(pid: int, kernel: int, instances=()) -> str:
    """What a process of the kernel's tree is, from its command line."""
    if pid == kernel:
        return "kernel (driver)"
    if pid in instances:
        return "instance"
    args = cmdline(pid)
    text = " ".join(args)
    if args and os.path.basename(args[0]).startswith("java"):
        return "JVM"
    if "statekit.engine.spark.fork_server" in text:
        return _forked_role(pid, args[-1], kernel, instances)
    for module, name in (("statekit.broker", "broker"), ("statekit.registry", "schema registry"),
                         ("statekit.worker.instance", "spare instance"),
                         ("python_streaming_source_runner", "source runner")):
        if module in text:
            return name
    if "statekit.engine.spark.worker_daemon" in text or "pyspark.daemon" in text:
        planner = next((a for a in args if a.startswith("pyspark.sql.worker.")), None)
        kind = f"planner {planner.rsplit('.', 1)[1]}" if planner else "Python worker"
        parent = cmdline(_ppid(pid))
        forked = parent and not os.path.basename(parent[0]).startswith("java") and _ppid(pid) != kernel
        return kind if forked else f"{kind} daemon"      # a daemon forks its workers
    return os.path.basename(args[0]) if args else "?"


def _forked_role(pid: int, sock: str, kernel: int, instances) -> str:
    """A process of the fork server (engine.spark.fork_server): the server, a child it forked
    for a stand-in the JVM started (named as that stand-in), or a worker such a child forked."""
    from statekit.engine.spark.fork_server import stand_ins

    if _ppid(pid) == kernel:
        return "fork server"
    standin = {child: s for s, child in stand_ins(sock).items()}.get(pid)
    if standin is not None:
        return role(standin, kernel, instances) + " (forked)"
    return "Python worker (forked)"


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def snapshot(kernel: int, instances=()) -> list:
    """[(role, pid, PSS kB, RSS kB)] of the kernel's tree."""
    rows = []
    for pid in tree(kernel):
        pss, rss = memory_kb(pid)
        if pss or rss:
            rows.append((role(pid, kernel, instances), pid, pss, rss))
    return rows


def by_role(rows) -> str:
    agg: dict = {}
    for r, _pid, pss, rss in rows:
        n, p, s = agg.get(r, (0, 0, 0))
        agg[r] = (n + 1, p + pss, s + rss)
    parts = [f"{r} ×{n}: {p / 1024:.0f}" if n > 1 else f"{r}: {p / 1024:.0f}"
             for r, (n, p, _s) in sorted(agg.items(), key=lambda kv: -kv[1][1])]
    return "; ".join(parts)


def totals(rows) -> tuple:
    return (sum(r[2] for r in rows) / 1024, sum(r[3] for r in rows) / 1024, len(rows))


def idle_cpu(pids_fn, seconds: float) -> tuple:
    """(cores used over `seconds` by the processes `pids_fn()` lists, {pid: cores}); a process
    that ends meanwhile counts what it used until its last sample, one born meanwhile all of it."""
    seen: dict = {}
    start: dict = {}
    t0 = time.monotonic()
    for p in pids_fn():
        start[p] = seen[p] = cpu_ticks(p)
    while time.monotonic() - t0 < seconds:
        time.sleep(min(1.0, max(0.0, seconds - (time.monotonic() - t0))))
        for p in pids_fn():
            start.setdefault(p, 0)
            seen[p] = max(seen.get(p, 0), cpu_ticks(p))
    span = time.monotonic() - t0
    per = {p: (seen[p] - start[p]) / _TICK / span for p in seen}
    return sum(per.values()), per


def cpu_by_role(per: dict, rows) -> str:
    roles = {pid: r for r, pid, _pss, _rss in rows}
    agg: dict = {}
    for pid, cores in per.items():
        r = roles.get(pid, "ended")
        agg[r] = agg.get(r, 0.0) + cores
    return "; ".join(f"{r}: {c:.4f}" for r, c in sorted(agg.items(), key=lambda kv: -kv[1]) if c > 0)


# -- the kernel: broker, registry, one app ----------------------------------------------------------

KERNEL = r"""
import json, os, sys, time
sys.path.insert(0, {root!r})
sys.path.insert(0, os.path.join({root!r}, "bench"))
from footprint import launch_cpu
def say(**kw):
    print(json.dumps(kw), flush=True)
import statekit
from statekit import broker, registry
from statekit.datagen import produce_fast
b = broker.start(dir=os.path.join({work!r}, "broker"), port=0)   # as %statekit up
r = registry.start(dir=b.dir)
os.environ["STATEKIT_BOOTSTRAP"] = b.bootstrap
produce_fast("input", "accounts", seed=1, limit={records}, keys={records}, bootstrap=b.bootstrap,
             partitions={partitions})

def first_output(name):
    app = statekit.App(name, bootstrap=b.bootstrap, instances={instances},
                       state_dir=os.path.join({work!r}, name))
    app.stream("input", value_serde="json").group_by_key().count(store="counts")
    cpu0, t0 = launch_cpu(), time.time()
    app.start()
    e = app.wait_for_event(lambda e: e.type == "commit" and e.records > 0, 600)
    return app, e.ts - t0, launch_cpu() - cpu0, os.getloadavg()[0]

app, first, cpu, load = first_output("footprint")
pids = [int(m["pid"]) for m in app._coordinator.members_frame_rows()]   # no pandas here
from statekit.engine.spark import session
say(event="first", first=first, cpu=cpu, load=load, instances=pids,
    direct=session._OWNED.launched_directly)
if {only_launch}:            # another cold launch, for the median: nothing else is measured
    app.stop()
    session.stop_session()
    r.stop()
    b.stop()
    raise SystemExit(0)
if not app.process_all_available(timeout=600):
    raise SystemExit(f"the app did not catch up: {{app.state}} {{app.error}}")
say(event="caught-up")
for line in sys.stdin:
    if line.strip() == "wake":           # one new record, until its count is queryable
        from statekit.kafka import Kafka
        from statekit.partition import partition_for
        key = b"acct-new"
        with Kafka(b.bootstrap) as k:
            t1 = time.monotonic()
            k.send("input", partition_for(key, {partitions}), [(key, b'{{"amount": 1}}')])
        while app.query("counts", "acct-new") != 1:
            time.sleep(0.005)
        say(event="woke", s=time.monotonic() - t1)
    else:
        break
app.stop()
warm_app, warm, warm_cpu, warm_load = first_output("footprint-warm")   # the JVM up, as after %statekit up
say(event="warm", first=warm, cpu=warm_cpu, load=warm_load)
warm_app.stop()
from statekit.engine.spark.session import stop_session
stop_session()
r.stop()
b.stop()
say(event="stopped")
"""


def launch_cpu() -> float:
    """CPU seconds this process and every process it started have used (the ones that ended
    and were waited for included: a parent's cutime/cstime)."""
    total = 0
    for pid in tree(os.getpid()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])
        except (OSError, ValueError, IndexError):
            pass
    return total / _TICK


def _read(proc, want: str, timeout: float = 900) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the kernel ended before '{want}': {proc.stderr.read()[-2000:]}")
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("event") == want:
            return msg
    raise RuntimeError(f"no '{want}' within {timeout:.0f} s")


@contextlib.contextmanager
def _kernel(work: str, instances: int, records: int, only_launch: bool):
    """A kernel process in ``work``; killed if it is still running at the end, and what it left
    in ``work`` stopped."""
    code = KERNEL.format(root=ROOT, work=work, records=records, instances=instances,
                         partitions=PARTITIONS, only_launch=only_launch)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=work)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _reap_tree_leftovers(work)


def measure_cold_launch(work: str, instances: int, records: int) -> dict:
    """One more cold launch in a fresh kernel (its first event)."""
    with _kernel(work, instances, records, only_launch=True) as proc:
        first = _read(proc, "first")
        proc.wait(timeout=120)
    return first


def measure_statekit(work: str, instances: int, records: int, seconds: float, idle_wait: float):
    with _kernel(work, instances, records, only_launch=False) as proc:
        first = _read(proc, "first")
        inst = set(first["instances"])
        started = snapshot(proc.pid, inst)
        _read(proc, "caught-up")
        time.sleep(idle_wait)
        cpu, per = idle_cpu(lambda: tree(proc.pid), seconds)
        idle = snapshot(proc.pid, inst)
        load = os.getloadavg()[0]
        proc.stdin.write("wake\n")
        proc.stdin.flush()
        wake = _read(proc, "woke")["s"]
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        warm = _read(proc, "warm")
        _read(proc, "stopped", timeout=300)
        proc.wait(timeout=60)
    return {"first": first["first"], "first_cpu": first["cpu"], "first_load": first["load"],
            "first_direct": first["direct"], "warm": warm["first"], "warm_cpu": warm["cpu"], "warm_load": warm["load"], "started": started, "idle": idle, "cpu": cpu,
            "cpu_roles": cpu_by_role(per, idle), "wake": wake, "load": load}


def _reap_tree_leftovers(work: str) -> None:
    """A kernel that failed may leave its broker or registry (they are not its children's
    children once it is gone): stop what was started in `work`."""
    from statekit import broker, registry

    d = os.path.join(work, "broker")
    for stop in (registry.stop, broker.stop):
        try:
            stop(d)
        except Exception:  # noqa: BLE001
            pass


# -- the floor: a one-process Kafka client app ------------------------------------------------------

CLIENT = r"""
import json, os, sys, time
t_spawn = float(sys.argv[1])
from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING
from rocksdict import Rdict
def say(**kw):
    print(json.dumps(kw), flush=True)
db = Rdict(os.path.join({work!r}, "counts"))
c = Consumer({{"bootstrap.servers": {bootstrap!r}, "group.id": "footprint-floor",
              "enable.auto.commit": False, "auto.offset.reset": "earliest"}})
c.assign([TopicPartition("input", p, OFFSET_BEGINNING) for p in range({partitions})])
seen, first = 0, None
while True:
    msgs = c.consume(1000, timeout=1.0)
    for m in msgs:
        if m.error():
            continue
        k = m.key()
        db[k] = (db.get(k) or 0) + 1
        seen += 1
    if msgs:
        c.commit(asynchronous=False)
        if first is None:
            first = time.time() - t_spawn
            say(event="first", first=first, cpu=time.process_time())
        if seen >= {records}:
            say(event="caught-up")
"""


def measure_client(work: str, bootstrap: str, records: int, seconds: float, idle_wait: float):
    code = CLIENT.format(work=work, bootstrap=bootstrap, records=records, partitions=PARTITIONS)
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-c", code, repr(t0)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=work)
    try:
        first = _read(proc, "first", timeout=300)
        _read(proc, "caught-up", timeout=300)
        time.sleep(idle_wait)
        cpu, _per = idle_cpu(lambda: tree(proc.pid), seconds)
        idle = snapshot(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    return {"first": first["first"], "first_cpu": first["cpu"], "idle": idle, "cpu": cpu}


def client_run(work: str, records: int, seconds: float) -> dict:
    from statekit import broker
    from statekit.datagen import produce_fast

    handle = broker.start(dir=os.path.join(work, "broker-floor"), port=0)
    try:
        produce_fast("input", "accounts", seed=1, limit=records, keys=records,
                     bootstrap=handle.bootstrap, partitions=PARTITIONS)
        return measure_client(work, handle.bootstrap, records, seconds, idle_wait=5.0)
    finally:
        handle.stop()


def _idle_wait(given) -> float:
    from statekit.engine.spark.session import PYTHON_WORKER_IDLE_S

    return PYTHON_WORKER_IDLE_S + 15 if given is None else given


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--seconds", type=float, default=20.0, help="the idle CPU's window")
    ap.add_argument("--idle-wait", type=float, default=None,
                    help="seconds idle before sampling (default: until Spark's idle Python "
                         "workers have gone)")
    ap.add_argument("--launches", type=int, default=3,
                    help="cold launches, each in a fresh kernel; the figure is their median")
    args = ap.parse_args(argv)

    work = tempfile.mkdtemp(prefix="statekit-bench-footprint-")
    try:
        floor = client_run(os.path.join(work), args.records, args.seconds)
        os.makedirs(os.path.join(work, "kernel"))
        sk = measure_statekit(os.path.join(work, "kernel"), args.instances, args.records,
                              args.seconds, _idle_wait(args.idle_wait))
        launches = [{"first": sk["first"], "cpu": sk["first_cpu"], "load": sk["first_load"],
                     "direct": sk["first_direct"]}]
        for i in range(1, max(1, args.launches)):
            os.makedirs(os.path.join(work, f"launch-{i}"))
            launches.append(measure_cold_launch(os.path.join(work, f"launch-{i}"), args.instances,
                                                args.records))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cold = statistics.median(x["first"] for x in launches)

    pss0, rss0, n0 = totals(sk["started"])
    pss, rss, n = totals(sk["idle"])
    fpss, frss, _ = totals(floor["idle"])
    print(f"right after the first output: {pss0:.0f} MB PSS ({rss0:.0f} MB RSS summed) in {n0} "
          f"processes: {by_role(sk['started'])}", flush=True)
    print(f"started app, idle ({args.instances} instances): {pss:.0f} MB PSS ({rss:.0f} MB RSS "
          f"summed) in {n} processes: {by_role(sk['idle'])}", flush=True)
    print(f"  idle CPU {sk['cpu']:.4f} cores: {sk['cpu_roles']} (load average "
          f"{sk['load']:.1f} on {os.cpu_count()} cores)", flush=True)
    print(f"one-process client app (confluent-kafka + rocksdict), idle: {fpss:.0f} MB PSS "
          f"({frss:.0f} MB RSS), {floor['cpu']:.4f} cores", flush=True)
    each = ", ".join(f"{x['first']:.2f} s ({x['cpu']:.1f} s of CPU, load average {x['load']:.1f}"
                     f"{'' if x['direct'] else ', through spark-submit'})" for x in launches)
    print(f"cold launch (no JVM yet), App.start() to the first committed micro-batch: median "
          f"{cold:.2f} s of {len(launches)} fresh kernels: {each}; "
          f"warm (the JVM up, as after %statekit up): {sk['warm']:.2f} s, {sk['warm_cpu']:.1f} s of "
          f"CPU (load average {sk['warm_load']:.1f}); the client app, "
          f"spawn to its first record counted: {floor['first']:.2f} s, {floor['first_cpu']:.1f} s "
          f"of CPU", flush=True)
    print(f"a new record sent to the idle app is queryable {sk['wake'] * 1000:.0f} ms later",
          flush=True)
    print(f"FIGURE name=footprint_idle_cpu value={sk['cpu']:.4f} unit=cores "
          f"baseline={max(floor['cpu'], 1e-4):.4f} ratio={sk['cpu'] / max(floor['cpu'], 1e-4):.3f}",
          flush=True)
    print(f"FIGURE name=footprint_cold_launch value={cold:.3f} unit=s "
          f"baseline={floor['first']:.3f} ratio={cold / floor['first']:.3f}", flush=True)
    print(f"RESULT name=footprint_pss value={pss:.0f} unit=MB baseline={fpss:.0f} "
          f"ratio={pss / fpss:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
