"""The dashboard on a busy machine: an app with a million keys, a CPU hog on every core, a disk-loss
crash. Through the dashboard's model: the crash is on it within 1.5 s (the instance dead, its tasks
queued or restoring), every task that restores is seen restoring in a picture the dashboard drew,
no two panels of any picture disagree, and a refresh stays cheap (p95 under 250 ms).

In `make test`: the whole test takes 31-55 s on two cores shared with other work (most of it
building the million keys; 62 s once with the load average at 14), about the minute a test of
`make test` may take."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time

from kernel_ext.dashboard.model import disagreements
from kernel_ext.dashboard.view import LiveDashboard
from waiting import wait_until

KEYS = 1_000_000


@contextlib.contextmanager
def cpu_hog(n: int | None = None):
    """`n` processes (default: one per core) that spin until the block ends, even when it fails."""
    n = n or os.cpu_count() or 2
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(10)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy() -> tuple[float, float]:
    """(cores' busy seconds, wall seconds) since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(v) - v[3] - v[4]) / tick, time.monotonic()


def _p95(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.95 * len(xs)))]


def test_a_disk_loss_crash_beside_a_cpu_hog_is_on_the_model_at_once(broker, tmp_path):
    import statekit
    from statekit import datagen

    datagen.produce_fast("accounts", "accounts", 1, KEYS, broker.bootstrap, keys=KEYS, partitions=4)
    app = statekit.App("busy", bootstrap=broker.bootstrap, partitions=4, instances=2, engine="local",
                       state_dir=str(tmp_path / "state"))
    app.stream("accounts", value_serde="json").group_by_key().count(store="counts")
    drawn = []          # (when, picture) for every picture the dashboard drew
    d = LiveDashboard(app, name="busy")
    d.observers.append(lambda p: drawn.append((time.time(), p)))
    try:
        app.start(sink="none")
        d.refresh()
        d.start()
        assert app.process_all_available(timeout=300)
        wait_until(lambda: d.model.picture().header["rows"] == KEYS, 30,
                   f"the model counting {KEYS} keys from the tasks' commits", interval=0.1)
        with cpu_hog() as hog:
            t_hog = {p.pid: _cpu_seconds(p.pid) for p in hog}
            time.sleep(1.0)  # the hog has the cores for a second before the crash
            busy0 = _machine_busy()
            n0, drawn_before = len(d.refresh_times), len(drawn)
            published = []    # when the death was published (its ts)
            app.on_event(lambda e: published.append(e.ts) if e.type == "instance_died" else None)
            t_crash = time.time()
            rec = app.crash(mode="disk-loss", instance=0)
            t_returned = time.time()
            lost = set(rec["tasks"])
            assert lost, rec
            # the crash on the model: instance 0 dead, each of its tasks queued or restoring
            on_model = None
            sampled = []
            while on_model is None and time.time() - t_crash < 5:
                p = d.model.picture()
                sampled.append(p)
                status = {r["instance"]: r["status"] for r in p.instances}
                chips = {c["task"]: c["state"] for c in p.chips}
                if status.get(0) == "dead" and all(chips.get(t) in ("queued", "restoring") for t in lost):
                    on_model = time.time() - t_crash
                time.sleep(0.01)  # sampling: how soon the model shows the crash is what is measured
            assert on_model is not None and on_model < 1.5, (
                f"the crash reached the model after {on_model} s; crash() took {t_returned - t_crash:.2f} s, "
                f"the death was published {published[0] - t_crash:.2f} s after the call" if published else
                f"the crash reached the model after {on_model} s; its death was never published")
            # the restore to its end, under the hog
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                p = d.model.picture()
                sampled.append(p)
                rnd = p.round
                if rnd is not None and rnd.final and all(rnd.rows.get(t) and rnd.rows[t].status == "done"
                                                         for t in lost):
                    break
                time.sleep(0.05)  # sampling: every picture on the way is checked for disagreements
            assert rnd is not None and rnd.final, [(r.task, r.status) for r in rnd.rows.values()]
            n_end = len(d.refresh_times)
            wait_until(lambda: len(d.refresh_times) >= n_end + 2, 10, "two refreshes after the restore's end")
            busy1 = _machine_busy()
            hogged = {p.pid: _cpu_seconds(p.pid) - t_hog[p.pid] for p in hog}
        during = list(d.refresh_times)[n0:]
        pictures = [p for _t, p in drawn[drawn_before:]]
        restored = {t for t, r in rnd.rows.items() if r.status == "done" and r.restored}
        assert lost <= restored, (lost, restored)
        seen = {c["task"] for p in pictures for c in p.chips if c["state"] == "restoring"}
        assert restored <= seen, f"tasks never drawn restoring: {sorted(restored - seen)}"
        bad = [(p.version, x) for p in pictures + sampled for x in disagreements(p)]
        assert not bad, bad[:5]
        assert len(during) >= 5, during
        assert _p95(during) < 0.25, f"refresh p95 {_p95(during) * 1000:.0f} ms over {len(during)} refreshes"
        # the cores really were busy meanwhile, the hog's processes running
        cores = (busy1[0] - busy0[0]) / (busy1[1] - busy0[1])
        assert cores > 0.9 * (os.cpu_count() or 2) and all(s > 0.5 for s in hogged.values()), (cores, hogged)
        print(f"cores busy {cores:.2f}; crash on the model after {on_model * 1000:.0f} ms; {len(during)} "
              f"refreshes during the restore: p95 {_p95(during) * 1000:.1f} ms, max {max(during) * 1000:.1f} ms; "
              f"seen restoring {sorted(seen)}")
        final = d.model.picture()
        assert final.header["rows"] == KEYS
        assert [(r["instance"], r["status"]) for r in final.instances] == [(0, "dead"), (1, "alive")]
    finally:
        d.stop(timeout=5)
        app.stop()
    # nothing the dashboard started runs on: a forecast it was making when it stopped (a calibration
    # restore in the app, seconds under the hog) ends once the app stopped and closed its Kafka client
    def left():
        return [t.name for t in threading.enumerate() if t.name.startswith("statekit-dashboard-")
                and t.is_alive() and "final" not in t.name]
    wait_until(lambda: not left(), 10, "the dashboard's threads ending after the app stopped")
