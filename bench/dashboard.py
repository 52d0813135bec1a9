"""Dashboard refresh cost, idle and while a million keys restore, on a quiet machine and beside a CPU
hog on every core: the dashboard as it was (every refresh a whole collection: the app's lag table,
task status, instances, store contents, changelog figures, forecast, then the model and the
drawing; loaded from git at --baseline-rev) against the current one (a refresh draws a picture of
the model; events reach the model as they arrive; polls run in a thread of their own), in the same
run, on the same app.

    .venv/bin/python bench/dashboard.py [--keys N] [--rounds R] [--idle-s S] [--baseline-rev REV]
                                        [--baseline-repo DIR]

Starts its own broker (temp dir, port 0) and one app on the local engine (no Spark): one instance,
4 tasks, `--keys` accounts counted into one store. Per machine condition (quiet, then `os.cpu_count()`
spinning processes) and per dashboard (none, old, new):

* idle: the dashboard refreshes the running app for `--idle-s` seconds;
* restoring: `--rounds` times, a disk-loss crash and a restart, so every task restores its whole
  changelog; meanwhile the main thread runs a CPU-bound Python loop, as a user's cell would, and
  its speed is compared with the rounds without a dashboard.

Figures: refresh wall time p50/p95 (old: its whole refresh; new: its refresh, and beside it the
poll, which no refresh waits for), the kernel CPU the dashboard spends per second, how long after
the crash the dashboard drew the instance dead, and the user loop's speed. The idle CPU and memory
of a started app are measured by the engine's own benchmark, not here.

Before each round without a dashboard, the restore forecast a notebook cell makes
(`App.restore_forecast()`, made while the user's loop runs, as it runs through the restore), set
against the restore that follows: forecast / measured, per round
and as ``FIGURE name=restore_forecast_over_measured_<quiet|loaded> value=<median> unit=x
baseline=<the same without the load of the moment: the calibration's rate alone>``.

Last lines: ``FIGURE name=dashboard_refresh_<p50|p95>_<idle|restoring>_<quiet|loaded> value=<ms>
unit=ms baseline=<old ms> ratio=<new/old>``, and the p95 while restoring beside the hog as the one
summary line, ``RESULT name=dashboard_refresh_p95_restoring_loaded ...``.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
BASELINE_REV = "831de5b"   # the last commit with the dashboard that collected everything per refresh


def q(xs, f):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(f * len(xs)))] if xs else float("nan")


@contextlib.contextmanager
def cpu_hog(on: bool):
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range(os.cpu_count() or 2)] if on else []
    try:
        if procs:
            time.sleep(1.0)
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(10)


def load_old(rev: str, repo: str = ROOT):
    """The dashboard package at `rev`, importable as `old_dashboard` (None: no git, no such rev)."""
    try:
        names = subprocess.run(["git", "-C", repo, "ls-tree", "--name-only", rev, "kernel_ext/dashboard/"],
                               capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError) as err:
        print(f"no baseline: {err}", file=sys.stderr)
        return None
    root = tempfile.mkdtemp(prefix="statekit-old-dashboard-")
    pkg = os.path.join(root, "old_dashboard")
    os.makedirs(pkg)
    for path in names:
        if not path.endswith(".py"):
            continue
        src = subprocess.run(["git", "-C", repo, "show", f"{rev}:{path}"], capture_output=True, text=True,
                             check=True).stdout
        with open(os.path.join(pkg, os.path.basename(path)), "w") as f:
            f.write(src.replace("kernel_ext.dashboard", "old_dashboard"))
    sys.path.insert(0, root)
    import old_dashboard.view

    return old_dashboard.view


class Old:
    """The old LiveDashboard, each refresh timed; `dead_at()`: when a refresh first showed the
    crashed instance dead."""

    def __init__(self, mod, app, changelog_fn):
        self.d = mod.LiveDashboard(app, name=app.name, interval=1.0, changelog_fn=changelog_fn)
        self.times, self.crash_at, self.seen_dead = [], None, None
        orig = self.d.refresh

        def timed():
            t = time.perf_counter()
            snap = orig()
            self.times.append(time.perf_counter() - t)
            if self.crash_at is not None and self.seen_dead is None and any(
                    str(r.get("status")) == "dead" for r in snap.instances):
                self.seen_dead = time.time() - self.crash_at
            return snap

        self.d.refresh = timed

    def start(self):
        self.d.start()

    def stop(self):
        self.d.stop()

    def cpu(self):
        return self.d.cpu_s


class New:
    def __init__(self, app, changelog_fn):
        from kernel_ext.dashboard.view import LiveDashboard

        self.d = LiveDashboard(app, name=app.name, interval=1.0, changelog_fn=changelog_fn)
        self.crash_at, self.seen_dead = None, None
        self.d.observers.append(self._seen)
        self.n0 = self.p0 = 0

    def _seen(self, p):
        if self.crash_at is not None and self.seen_dead is None and any(
                r["status"] == "dead" for r in p.instances):
            self.seen_dead = time.time() - self.crash_at

    @property
    def times(self):
        return list(self.d.refresh_times)[self.n0:]

    @property
    def polls(self):
        return list(self.d.poller.times)[self.p0:]

    def start(self):
        self.n0, self.p0 = len(self.d.refresh_times), len(self.d.poller.times)
        self.d.start()

    def stop(self):
        self.d.stop()

    def cpu(self):
        return self.d.cpu_s + self.d.poller.cpu_s + self.d.feed.cpu_s


def spin_until(done) -> float:
    """A user's cell: a CPU-bound Python loop until `done()`; returns its loops per second."""
    n, t0 = 0, time.perf_counter()
    while n % 20 or not done():
        x = 0
        for i in range(20_000):
            x += i
        n += 1
    return n / max(1e-9, time.perf_counter() - t0)


OPENED = [0]   # task_opened events seen (counted by an App.on_event callback)


FORECASTS: dict = {}   # condition -> [(forecast s, forecast s without the load of the moment, measured s)]


def forecast_then_measure(app, cond: str) -> None:
    """The restore forecast a notebook cell makes before a crash (`App.restore_forecast()`), set
    against the restore from scratch that follows it (the next round's, measured by its tasks).
    The user's loop runs while the forecast is made, as it runs through the restore: the machine
    the forecast measures is the one the restore gets (a load that changes between the two is
    what `make demo` shows; here the figure is the forecast on a quiet and on a loaded machine)."""
    import threading

    made: list = []
    th = threading.Thread(target=lambda: made.append(app.restore_forecast()), daemon=True)
    th.start()
    spin_until(lambda: not th.is_alive())
    if not made:
        raise SystemExit("the restore forecast failed (its error is above)")
    fc = made[0]
    f = fc.frame[fc.frame.source == "scratch"]
    FORECASTS.setdefault(cond, []).append([float(f.seconds.sum()), float((f.seconds / f.load).sum()), None])


def measured_restore(app, cond: str) -> None:
    rows = FORECASTS.get(cond) or []
    if rows and rows[-1][2] is None:
        rs = app.restore_summary()   # since the restart: every task's restore time, summed
        rows[-1][2] = float(rs.seconds.sum())
        f, flat, took = rows[-1]
        print(f"[{cond}] restore forecast {f:.2f} s (without the load of the moment {flat:.2f} s), "
              f"measured {took:.2f} s: forecast / measured {f / took:.2f}", flush=True)


def restore_round(app, dash, cond: str | None = None) -> float:
    """A disk-loss crash and a restart (every task restores from scratch) with the user loop
    running; returns the loop's speed meanwhile. With `cond`, the forecast made before the crash
    is set against the restore."""
    from statekit.app import AppState

    app.wait_for_state([AppState.RUNNING], timeout=120)
    if cond is not None:
        forecast_then_measure(app, cond)
    if dash is not None:
        dash.crash_at = time.time()
    app.crash(mode="disk-loss", instance=0)
    app.wait_for_state([AppState.ERROR], timeout=60)
    time.sleep(1.5)   # the dashboard shows the crash (and the old one its ERROR)
    opened = OPENED[0]
    app.restart()
    speed = spin_until(lambda: app.state == AppState.RUNNING and OPENED[0] >= opened + app.partitions)
    if cond is not None:
        measured_restore(app, cond)
    return speed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3, help="restores per dashboard and condition")
    ap.add_argument("--idle-s", type=float, default=8.0)
    ap.add_argument("--baseline-rev", default=BASELINE_REV)
    ap.add_argument("--baseline-repo", default=ROOT, help="the git checkout to read --baseline-rev from")
    a = ap.parse_args(argv)

    home = tempfile.mkdtemp(prefix="statekit-bench-dashboard-")
    os.environ["STATEKIT_HOME"] = home
    from statekit import broker as broker_mod
    from statekit import datagen

    old_mod = load_old(a.baseline_rev, a.baseline_repo)
    handle = broker_mod.start(dir=os.path.join(home, "broker"), port=0)
    app = None
    try:
        import statekit

        t0 = time.monotonic()
        datagen.produce_fast("accounts", "accounts", 1, a.keys, handle.bootstrap, keys=a.keys, partitions=4)
        app = statekit.App("benchdash", bootstrap=handle.bootstrap, partitions=4, instances=1, engine="local",
                           state_dir=os.path.join(home, "state"))
        app.stream("accounts", value_serde="json").group_by_key().count(store="counts")
        app.start(sink="none")
        assert app.process_all_available(timeout=600)
        print(f"{a.keys:,} keys in the store after {time.monotonic() - t0:.1f} s", flush=True)

        def changelog_stats():
            return [s for s in broker_mod.log_stats(handle.dir) if s["topic"].startswith("benchdash-")
                    and s["topic"].endswith("-changelog")]

        kinds = ["none"] + (["old"] if old_mod is not None else []) + ["new"]
        app.on_event(lambda e: OPENED.__setitem__(0, OPENED[0] + (e.type == "task_opened")))
        res: dict = {}
        for cond in ("quiet", "loaded"):
            with cpu_hog(cond == "loaded"):
                dashes = {"none": None}
                for kind in kinds[1:]:
                    dash = dashes[kind] = Old(old_mod, app, changelog_stats) if kind == "old" else New(app, changelog_stats)
                    dash.start()
                    w0, c0 = time.monotonic(), dash.cpu()
                    time.sleep(a.idle_s)
                    res[(cond, kind)] = {"idle": list(dash.times), "idle_cpu": (dash.cpu() - c0) / (time.monotonic() - w0),
                                         "restoring": [], "polls": [], "speeds": [], "dead": [], "busy": 0.0, "cpu": 0.0}
                    dash.stop()
                res[(cond, "none")] = {"speeds": []}
                for _ in range(a.rounds):   # the dashboards take turns, so the machine's drift hits each alike
                    for kind in kinds:
                        r, dash = res[(cond, kind)], dashes[kind]
                        if dash is None:
                            r["speeds"].append(restore_round(app, None, cond))
                            continue
                        dash.start()
                        n, np_ = len(dash.times), len(dash.polls) if kind == "new" else 0
                        w, c = time.monotonic(), dash.cpu()
                        dash.seen_dead = None
                        r["speeds"].append(restore_round(app, dash))
                        r["busy"] += time.monotonic() - w
                        r["cpu"] += dash.cpu() - c
                        r["dead"].append(dash.seen_dead)
                        r["restoring"] += list(dash.times)[n:]
                        if kind == "new":
                            r["polls"] += list(dash.polls)[np_:]
                        dash.stop()
                none = statistics.median(res[(cond, "none")]["speeds"])
                print(f"[{cond}] no dashboard: a user's loop runs {none:.0f} loops/s while the app restores", flush=True)
                for kind in kinds[1:]:
                    r = res[(cond, kind)]
                    idle, restoring, polls = r["idle"], r["restoring"], r["polls"]
                    poll = (f"; polls (off the refresh path) p50 {q(polls, .5) * 1000:.1f} / p95 "
                            f"{q(polls, .95) * 1000:.1f} ms" if kind == "new" else "")
                    print(f"[{cond}] {kind} dashboard: refresh idle p50 {q(idle, .5) * 1000:.1f} / p95 "
                          f"{q(idle, .95) * 1000:.1f} ms ({len(idle)}), restoring p50 {q(restoring, .5) * 1000:.1f} / "
                          f"p95 {q(restoring, .95) * 1000:.1f} ms ({len(restoring)}){poll}; kernel CPU "
                          f"{r['idle_cpu'] * 1000:.0f} ms/s idle, {r['cpu'] / max(1e-9, r['busy']) * 1000:.0f} ms/s "
                          f"restoring; crash drawn after "
                          f"{', '.join('–' if x is None else f'{x:.2f} s' for x in r['dead'])}; the user's loop at "
                          f"{statistics.median(r['speeds']) / none:.2f}x its speed without a dashboard", flush=True)
        results = []
        for cond in ("quiet", "loaded"):
            new, old = res[(cond, "new")], res.get((cond, "old"))
            for phase in ("idle", "restoring"):
                for f in (0.5, 0.95):
                    v = q(new[phase], f) * 1000
                    b = q(old[phase], f) * 1000 if old else float("nan")
                    results.append((f"dashboard_refresh_p{int(f * 100)}_{phase}_{cond}", v, b))
        results.sort(key=lambda r: r[0] == "dashboard_refresh_p95_restoring_loaded")
        for cond in ("quiet", "loaded"):
            rows = [r for r in FORECASTS.get(cond, []) if r[2]]
            if rows:   # the median forecast / measured, beside the calibration's without the load now
                v = statistics.median(f / took for f, _flat, took in rows)
                b = statistics.median(flat / took for _f, flat, took in rows)
                print(f"FIGURE name=restore_forecast_over_measured_{cond} value={v:.2f} unit=x "
                      f"baseline={b:.2f} ratio={v / b:.4f}")
        for i, (name, v, b) in enumerate(results):
            kind = "RESULT" if i == len(results) - 1 else "FIGURE"
            print(f"{kind} name={name} value={v:.2f} unit=ms baseline={b:.2f} ratio={v / b:.4f}")
        return 0
    finally:
        if app is not None:
            try:
                app.stop()
            except Exception as err:
                print(f"stopping the app: {err}", file=sys.stderr)
        handle.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
