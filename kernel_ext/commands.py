"""What `%statekit` does: one `Session` per kernel that runs parsed commands against the library.

Thin on purpose: every action is a call into `statekit` (the App, `statekit.kafka`, the datagen
producer, the Spark session helper); this module only keeps the kernel's registry (broker handle,
apps by name, producers, dashboards) and turns results into HTML, DataFrames and widgets.
"""
from __future__ import annotations

import html
import os
import time
import traceback
from typing import Any

from kernel_ext.lines import Notice, Voice, current_cell, one_line, say
from kernel_ext.parser import Command
from kernel_ext.producing import ProducerJob
from kernel_ext.querying import query, typed_key
from statekit.contracts import CHANGELOG_SUFFIX, EVENTS_SUFFIX

INTERNAL_SUFFIXES = (EVENTS_SUFFIX,)


def _e(x) -> str:
    return html.escape(str(x))


def _card(title: str, rows: list[tuple[str, str]], ok: bool = True) -> str:
    color = "#2e7d32" if ok else "#c62828"
    body = "".join(f"<tr><td style='color:#667;padding:1px 12px 1px 0;text-align:left'>{_e(k)}</td>"
                   f"<td style='text-align:left'>{v}</td></tr>" for k, v in rows)
    return (f"<div style='font-family:sans-serif;font-size:12.5px;border:1px solid #dde4ee;border-left:4px solid "
            f"{color};border-radius:6px;padding:6px 12px;background:#f9fbfd;max-width:760px'>"
            f"<div style='font-weight:600;margin-bottom:4px'>{_e(title)}</div><table>{body}</table></div>")


def app_uses_spark(app) -> bool:
    """Whether the app's engine runs on Spark (`%statekit start` then starts the session first)."""
    return getattr(app, "engine_name", "changelog") != "local"


class Session:
    """The kernel's statekit state. `run(cmd)` executes one parsed command.

    It remembers what `up` started (the embedded broker, the Spark session), so that `up` twice
    reuses them and `down` stops exactly those; and it keeps one dashboard per app, which `crash`,
    `restart`, `kill`, `scale`, ... bring back to life instead of showing another one."""

    def __init__(self, shell=None):
        self.shell = shell
        self.bootstrap: str | None = None
        self.broker = None  # BrokerHandle of the embedded broker `up` started or reused
        self.registry = None  # RegistryHandle of the embedded Schema Registry `up` started or reused
        self.registry_error: str | None = None  # why `up` could not start it
        self.spark = None
        self.apps: dict[str, Any] = {}
        self.producers: dict[str, ProducerJob] = {}
        self.dashboards: dict[str, Any] = {}
        self.last_traceback: str | None = None
        self._env_bootstrap = False  # `up` set STATEKIT_BOOTSTRAP (down unsets it)
        self._error_hooks: set = set()  # id(app) of apps whose errors are reported in the notebook
        self.voice = Voice()             # what was said about each app's failures, and where

    # -- plumbing -------------------------------------------------------------------------------

    def display(self, obj=None, html_text: str | None = None):
        from IPython.display import HTML, display

        if html_text is not None:
            display(HTML(html_text))
        else:
            display(obj)

    def run(self, cmd: Command):
        fn = getattr(self, "cmd_" + cmd.command.replace("-", "_"))
        return fn(cmd)

    def _kafka(self):
        from statekit.kafka import Kafka

        self._ensure_up(spark=False)
        return Kafka(self.bootstrap)

    def _ensure_up(self, spark: bool = False):
        if self.bootstrap is None:
            self._up(None, spark=spark)
        elif spark and self.spark is None:
            self._start_spark()

    def _embedded_dir(self) -> str:
        from statekit.contracts import statekit_home

        return os.path.join(statekit_home(), "broker")

    def _up(self, bootstrap: str | None, spark: bool = True, master: str | None = None,
            tls: bool = False, mtls: bool = False) -> str:
        """Connect (or reconnect) and say how: the one line `up` prints about the broker."""
        from statekit.errors import BrokerUnreachable, StatekitError
        from statekit.kafka import Kafka

        explicit = bootstrap or (None if self._env_bootstrap else os.environ.get("STATEKIT_BOOTSTRAP"))
        if explicit and (tls or mtls):
            raise StatekitError("--tls is for the embedded broker: for another cluster, set security.protocol "
                                "in STATEKIT_KAFKA_CONFIG")
        if explicit:
            if self.broker is not None and self.broker.owned and explicit != self.broker.bootstrap:
                raise BrokerUnreachable(f"this kernel runs the embedded broker at {self.bootstrap}: "
                                        f"`%statekit down` first, then `up --bootstrap {explicit}`")
            self.bootstrap, self.broker = explicit, None
            how = f"external cluster at {explicit}"
        elif self.broker is not None and self.broker.alive:
            self.broker.require(tls, mtls)
            how = (f"reusing the embedded broker this kernel started (pid {self.broker.pid})"
                   if self.broker.owned else
                   f"reusing the embedded broker started by another process (pid {self.broker.pid})")
        else:
            from statekit import broker as broker_mod  # the embedded broker's lifecycle API

            # a shared host (JupyterHub): other users' processes must not reach this broker
            auth = broker_mod.should_auth()
            self.broker = broker_mod.start(dir=self._embedded_dir(), auth=auth, mtls=mtls,
                                           tls=tls or mtls or broker_mod.should_tls()).require(tls, mtls)
            self.bootstrap = self.broker.bootstrap
            how = (f"started the embedded broker (pid {self.broker.pid}"
                   f"{', ' + self.broker.security if self.broker.security else ''})" if self.broker.owned else
                   f"reusing the embedded broker started by another process (pid {self.broker.pid}); "
                   f"`down` will leave it running"
                   + ("; it stops when that process ends (`statekit broker start` runs one apart)"
                      if self.broker.tied else ""))
        try:
            Kafka(self.bootstrap, timeout=10).close()
        except BrokerUnreachable:
            self.bootstrap = None
            raise
        # apps created from now on (and Kafka() without arguments) use this broker
        if os.environ.get("STATEKIT_BOOTSTRAP") != self.bootstrap:
            os.environ["STATEKIT_BOOTSTRAP"] = self.bootstrap
            self._env_bootstrap = True
        if self.broker is not None:
            self._start_registry()
        if spark:
            self._start_spark(master)
        return how

    def _start_registry(self) -> None:
        """The embedded Schema Registry beside the embedded broker, its schemas in the broker's
        directory; processes find it there (`statekit.registry.status()`). Not starting it leaves
        the broker up: the status card says why."""
        from statekit import registry as registry_mod  # the registry's lifecycle API
        from statekit.errors import StatekitError

        if self.registry is not None and self.registry.alive:
            return
        try:
            self.registry = registry_mod.start(dir=self.broker.dir, auth=self.broker.auth,
                                               tls=self.broker.tls)
            self.registry_error = None
        except StatekitError as err:
            self.registry, self.registry_error = None, one_line(err)

    def _start_spark(self, master: str | None = None):
        """The Spark session, local unless ``master`` (or $STATEKIT_SPARK_MASTER) names a cluster
        (its JVM writes to a log file, not into the cell that runs:
        statekit.engine.spark.session.jvm_stderr_path)."""
        from statekit.engine.spark.session import get_session

        self.spark = get_session(master=master)

    def app(self, name: str):
        from statekit.errors import StatekitError

        try:
            return self.apps[name]
        except KeyError:
            known = ", ".join(sorted(self.apps)) or "none yet"
            raise StatekitError(f"no app named {name!r} (known: {known}); define it with a "
                                f"`%%statekit app {name}` cell") from None

    def _report_errors(self, name: str, app) -> None:
        """Say an app's one-line error when it fails (from the app's event thread: ipykernel sends
        a thread's output to the running, or last, cell; `Voice.failure` keeps it out from under
        the dashboard). A crash or kill the user asked for is not a failure: the command that asked
        (`crash`, `kill`, `wait`) says what happened, so nothing is said twice."""
        on = getattr(app, "on_event", None)
        if not callable(on) or id(app) in self._error_hooks:
            return
        self._error_hooks.add(id(app))

        died = {}

        def on_event(e):
            kind = getattr(e, "type", None)
            if kind == "instance_died":
                died.update(ts=e.ts, cause=e.cause, instance=e.instance)
                return
            if kind != "state":
                return
            if e.state != "ERROR":
                died.clear()   # a restart, a rebalance: a later ERROR is news of its own
                return
            if self.apps.get(name) is not app:
                return  # redefined since
            if died.get("cause") in ("crash", "kill") and e.ts - died.get("ts", 0) < 10:
                return  # asked for: said by the command that asked, or that waited
            self._failed(name, getattr(e, "reason", "") or getattr(app, "error", "") or "failed")

        on(on_event)

    def _failed(self, name: str, reason) -> None:
        """Say an app's failure, unless it was said already (by the event thread, a command that
        waited, or a cell's exception)."""
        from statekit.errors import ProcessorError

        reason = one_line(reason)
        own_code = isinstance(getattr(self.apps.get(name), "error", None), ProcessorError)
        todo = (f"fix the `%%statekit app {name}` cell, run it again, then `%statekit start {name}`"
                if own_code else f"fix the cause, then `%statekit restart {name}`")
        if self.voice.claim(name, reason):
            self.voice.failure(name, f"%statekit: app {name} failed: {reason} (the dashboard keeps its "
                                     f"last state; {todo})")

    # -- broker & Spark -------------------------------------------------------------------------

    def _stop_everything_of_apps(self) -> list[str]:
        """Dashboards, producers and apps; one entry per producer or app that was still running
        (an app `stop` already stopped is not named again; down must get everything down, so a
        failure is noted and the rest goes on)."""
        for d in list(self.dashboards.values()):
            d.stop(timeout=3)
        self.dashboards.clear()
        return self.stop_producers_and_apps()

    def stop_producers_and_apps(self) -> list[str]:
        """What `_stop_everything_of_apps` stops but the dashboards (a kernel shutting down keeps
        them, to say so); the same entries."""
        stopped = []
        for topic, job in list(self.producers.items()):
            if job.running:
                stopped.append(f"the producer of {topic}")
            job.stop.set()
            job.thread.join(10)
        self.producers.clear()
        for name, app in list(self.apps.items()):
            if str(app.state) in ("CREATED", "NOT_RUNNING"):
                continue
            try:
                app.stop()
                stopped.append(f"app {name}")
            except Exception as err:
                stopped.append(f"app {name} ({one_line(err)[:80]})")
        return stopped

    def at_exit(self) -> None:
        """The kernel is going away (a restart, a shutdown) without `down`: every dashboard says its
        app is gone, not RUNNING. The processes statekit started end with the kernel by themselves
        (`statekit.lifeline`)."""
        for name, d in list(self.dashboards.items()):
            try:
                d.stop(timeout=1)
                d.final("NOT_RUNNING", note=f"the kernel stopped: app {name} and the processes it "
                                            f"started are gone (run the notebook again)")
            except Exception:   # the kernel is exiting: what cannot be said is not said
                pass
        for job in list(self.producers.values()):
            job.stop.set()

    def _fresh(self):
        """Stop the embedded broker and delete its data and every app's local state."""
        import shutil

        from statekit.errors import StatekitError

        if self.bootstrap is not None and self.broker is None:
            raise StatekitError("--fresh only applies to the embedded broker; this kernel uses the "
                                f"external cluster at {self.bootstrap} (a real cluster's topics are "
                                "not deleted from a notebook)")
        if os.environ.get("STATEKIT_BOOTSTRAP") and not self._env_bootstrap:
            raise StatekitError("--fresh only applies to the embedded broker; unset STATEKIT_BOOTSTRAP "
                                "(a real cluster's topics are not deleted from a notebook)")
        self._stop_everything_of_apps()
        self.apps.clear()
        from statekit import broker as broker_mod
        from statekit import registry as registry_mod

        registry_mod.stop(self._embedded_dir())
        self.registry = None
        broker_mod.stop(self._embedded_dir())
        if self._env_bootstrap:
            os.environ.pop("STATEKIT_BOOTSTRAP", None)
            self._env_bootstrap = False
        self.broker, self.bootstrap = None, None
        home = os.path.dirname(self._embedded_dir())
        for sub in ("broker", "apps", "produced"):
            shutil.rmtree(os.path.join(home, sub), ignore_errors=True)

    def cmd_up(self, cmd: Command):
        t0 = time.monotonic()
        if cmd.fresh:
            self._fresh()
        if cmd.master and cmd.no_spark:
            from statekit.errors import StatekitError

            raise StatekitError("--master starts Spark on that master: drop --no-spark (or --master)")
        how = self._up(cmd.bootstrap, spark=not cmd.no_spark, master=cmd.master, tls=cmd.tls, mtls=cmd.mtls)
        self.display(html_text=self._status_card(f"statekit is up ({time.monotonic() - t0:.1f} s): {how}"))

    def cmd_broker(self, cmd: Command):   # pause / restart the embedded broker: kernel_ext.outages
        from kernel_ext.outages import run_broker
        run_broker(self, cmd)

    def _status_card(self, title: str) -> str:
        rows = []
        if self.bootstrap:
            if self.broker is not None:
                who = "started by this kernel" if self.broker.owned else "reused: started by another process"
                kind = f"embedded broker, pid {self.broker.pid}, {who}, dir <code>{_e(self.broker.dir)}</code>"
                kind += f" · {self.broker.security}" if self.broker.security else ""
            else:
                kind = "external cluster"
            rows.append(("broker", f"<code>{_e(self.bootstrap)}</code> · {kind}"))
        else:
            rows.append(("broker", "not connected: <code>%statekit up</code>"))
        if self.registry is not None:
            who = "started by this kernel" if self.registry.owned else "reused: started by another process"
            rows.append(("schema registry", f"<code>{_e(self.registry.url)}</code> · embedded, pid "
                                            f"{self.registry.pid}, {who}"))
        elif self.registry_error:
            rows.append(("schema registry", f"not started: {_e(self.registry_error)}"))
        if self.spark is not None:
            from statekit.engine.spark.session import describe

            rows.append(("spark", " · ".join(_e(x) for x in describe(self.spark))))
        else:
            rows.append(("spark", "not started"))
        for name, app in sorted(self.apps.items()):
            rows.append((f"app {name}", f"<b>{_e(app.state)}</b> · {_e(self._app_shape(app))}"))
        for topic, job in sorted(self.producers.items()):
            p = job.progress
            sent = p.sent if p is not None else 0
            rows.append((f"producer {topic}", f"{'running' if job.running else 'done'} · {job.source} · "
                                              f"{sent:,} records sent"))
        return _card(title, rows, ok=self.bootstrap is not None)

    @staticmethod
    def _app_shape(app, standbys: bool = True) -> str:
        parts = [f"{app.partitions} task(s)"]
        if hasattr(app, "instances"):
            parts.append(f"{app.instances} live instance(s)")
        if standbys and getattr(app, "standby_replicas", None) is not None:
            parts.append(f"{app.standby_replicas} standby replica(s)")
        if not hasattr(app, "instances"):
            parts.append("Spark's own state store")
        return ", ".join(parts)

    def cmd_status(self, cmd: Command):
        self.display(html_text=self._status_card("statekit status"))

    def cmd_down(self, cmd: Command):
        stopped = self._stop_everything_of_apps()
        left = []
        if self.spark is not None:   # only what statekit started: a session you made stays
            from statekit.engine.spark.session import stop_session

            report = stop_session()
            self.spark = None
            stopped += [x for x in report.stopped if not x.startswith("query ")]
            left += report.left
        if self.registry is not None:
            if self.registry.owned:
                self.registry.stop()
                stopped.append(f"the schema registry at {self.registry.url}")
            else:
                left.append(f"left the schema registry at {self.registry.url} running: another process "
                            f"started it (pid {self.registry.pid}); `statekit registry stop --dir "
                            f"{self.registry.dir}` stops it")
            self.registry = None
        if self.broker is not None:
            if self.broker.owned:
                self.broker.stop()
                stopped.append(f"the embedded broker at {self.bootstrap}")
            else:
                left.append(f"left the embedded broker at {self.bootstrap} running: another process "
                            f"started it (pid {self.broker.pid}); `statekit broker stop --dir "
                            f"{self.broker.dir}` stops it")
        if self._env_bootstrap:
            os.environ.pop("STATEKIT_BOOTSTRAP", None)
            self._env_bootstrap = False
        self.broker = None
        self.bootstrap = None
        say("stopped: " + (", ".join(stopped) if stopped else "nothing was running")
            + "".join(f"\n{x}" for x in left))

    # -- topics ---------------------------------------------------------------------------------

    def cmd_topics(self, cmd: Command):
        import pandas as pd

        k = self._kafka()
        try:
            names = sorted(k.topics())
            if not cmd.internal:
                names = [n for n in names if not n.startswith("__") and not n.endswith(INTERNAL_SUFFIXES)]
            if cmd.pattern:
                names = [n for n in names if cmd.pattern in n]
            stats = {}
            if self.broker is not None:
                try:
                    from statekit import broker as broker_mod

                    for s in broker_mod.log_stats(self.broker.dir):
                        stats[(s["topic"], s["partition"])] = s
                except Exception:
                    stats = {}
            rows = []
            for n in names:
                ends = k.end_offsets(n)
                begins = k.begin_offsets(n)
                try:
                    policy = k.describe_configs(n).get("cleanup.policy", "?")
                except Exception:
                    policy = "?"
                part = [stats.get((n, p)) for p in sorted(ends)]
                have = [s for s in part if s]
                rows.append({
                    "topic": n,
                    "partitions": len(ends),
                    "end offsets": ", ".join(str(ends[p]) for p in sorted(ends)),
                    "records": sum(ends.values()) - sum(begins.values()),
                    "cleanup.policy": policy,
                    "records in log": sum(s.get("records", 0) for s in have) if have else None,
                    "dirty ratio": round(max(s.get("dirty_ratio") or 0 for s in have), 2) if have else None,
                    "cleaner runs": sum(s.get("cleaner_runs") or 0 for s in have) if have else None,
                    "removed by cleaner": sum(s.get("records_removed") or 0 for s in have) if have else None,
                })
        finally:
            k.close()
        if not rows:
            say("no topics yet" + (f" matching {cmd.pattern!r}" if cmd.pattern else ""))
            return None
        df = pd.DataFrame(rows).set_index("topic")
        if not stats:
            df = df.drop(columns=["records in log", "dirty ratio", "cleaner runs", "removed by cleaner"])
        return df

    # -- producing ------------------------------------------------------------------------------

    def cmd_produce(self, cmd: Command):
        from kernel_ext.producing import produce

        self._ensure_up(spark=False)
        produce(cmd, self.bootstrap, self._kafka, self.display, self.producers)

    # -- apps -------------------------------------------------------------------------------------

    def cmd_app(self, cmd: Command):
        import statekit
        from statekit.errors import StatekitError

        old = self.apps.get(cmd.name)
        self._ensure_up(spark=False)
        native = cmd.engine == "spark"
        every = (
            ("partitions", "partitions"), ("instances", "instances"), ("standby", "standby_replicas"),
            ("commit_interval", "commit_interval"), ("cache_bytes", "cache_bytes"), ("engine", "engine"),
            ("acceptable_lag", "acceptable_recovery_lag"), ("max_warmups", "max_warmup_replicas"),
            ("probing_interval", "probing_rebalance_interval"), ("guarantee", "processing_guarantee"),
            ("task_timeout", "task_timeout"))
        options = every[:1] if native else every
        if native:   # (Spark's own state store: one instance, its own engine)
            unsupported = [o for o, _a in every[1:] if o != "engine" and cmd.args.get(o) is not None]
            if unsupported:
                raise StatekitError(f"--engine spark (Spark's own state store) runs one instance without "
                                    f"standbys or warmups: drop --{unsupported[0].replace('_', '-')}")
        kw = {arg: cmd.args[opt] for opt, arg in options if cmd.args.get(opt) is not None}
        ns = self.shell.user_ns if self.shell is not None else {}
        before = dict(ns)   # a refused cell changes nothing: the namespace comes back as it was
        try:
            app = statekit.NativeApp(cmd.name, bootstrap=self.bootstrap, **kw) if native else \
                statekit.App(cmd.name, bootstrap=self.bootstrap, **kw)
            ns["app"] = app
            self._run_app_body(cmd, ns)
            # compile and check now (topology, source topics): a mistake shows here, not at start
            app.validate()
        except StatekitError as err:
            for k in [k for k in ns if k not in before]:
                del ns[k]
            ns.update({k: v for k, v in before.items() if ns.get(k, before) is not v})
            raise StatekitError(f"{err}; nothing was defined") from None
        replaced = self._replace(cmd.name, old) if old is not None and old is not app else ""
        self.apps[cmd.name] = app
        self._report_errors(cmd.name, app)
        n_stores = len(app.plan.stores) if getattr(app, "plan", None) is not None else None
        say(f"app {cmd.name!r} defined: {self._app_shape(app)}"
            + (f", {n_stores} store(s)" if n_stores is not None else "")
            + f"{replaced}. Next: %statekit start {cmd.name}")

    def _replace(self, name: str, old) -> str:
        """The app cell ran again: the earlier definition goes, whatever its state — stopped (its
        instance processes end, and with them the locks on its task directories), its dashboard
        retired with a line that says so. Its state stays on disk and in its changelogs for the new
        definition to start from. Returns the phrase the `defined` line adds."""
        state = str(old.state)
        self._retire_dashboard(name, note=f"app {name} was redefined: this dashboard no longer follows "
                                          f"it (`%statekit watch {name}` shows the new definition)")
        self.voice.forget(name)
        if state in ("CREATED", "NOT_RUNNING"):
            return ""
        try:
            old.stop()
        except Exception as err:   # it must not hold its task directories: end its processes
            self.last_traceback = traceback.format_exc()
            abort = getattr(getattr(old, "_runner", None), "abort_all", None)
            if callable(abort):
                abort()
            return f" (the earlier definition, {state}, could not stop cleanly: {one_line(err)[:120]}; its processes were killed)"
        return f" (the earlier definition, {state}, was stopped; its state stays for this one)"

    def _run_app_body(self, cmd: Command, ns: dict) -> None:
        """Run the cell body; a Python mistake in it becomes one line naming the body's line."""
        from statekit.errors import StatekitError

        code = compile(cmd.body or "", f"<%%statekit app {cmd.name}>", "exec")
        try:
            exec(code, ns)
        except StatekitError:
            raise
        except Exception as err:
            tb = traceback.extract_tb(err.__traceback__)
            line = next((f.lineno for f in reversed(tb) if f.filename.startswith("<%%statekit")), None)
            where = f"line {line}: " if line else ""
            self.last_traceback = traceback.format_exc()
            raise StatekitError(f"the app cell failed at {where}{type(err).__name__}: {err}") from None

    def cmd_apps(self, cmd: Command):
        import pandas as pd

        if not self.apps:
            say("no apps yet: define one with a `%%statekit app NAME` cell")
            return None
        return pd.DataFrame([{"app": n, "state": str(a.state), "tasks": a.partitions,
                              "instances": getattr(a, "instances", 1),
                              "standby": getattr(a, "standby_replicas", 0)}
                             for n, a in sorted(self.apps.items())]).set_index("app")

    def cmd_start(self, cmd: Command):
        app = self.app(cmd.name)
        state = str(app.state)
        if state in ("RUNNING", "RESTORING", "REBALANCING", "WAITING"):   # the start cell run twice
            if cmd.watch:
                say(f"{cmd.name}: already started ({state}); its dashboard below follows it")
                return self._watch(app, cmd.name)
            say(f"{cmd.name}: already started ({state}); nothing to do"
                + (self._follow(cmd.name, app) or f" (`%statekit watch {cmd.name}` shows it live)"))
            return None
        if state == "ERROR":
            return self._start_failed(cmd, app)
        self._ensure_up(spark=app_uses_spark(app))
        trigger = cmd.trigger
        if isinstance(trigger, str) and trigger.endswith(" seconds"):
            trigger = float(trigger.split()[0])
        sink = cmd.sink
        if sink is None:  # Spark's memory sink cannot recover from its checkpoint: no restart
            try:
                has_sinks = any(n.get("type") == "sink" for n in app.describe().get("nodes", []))
            except Exception:
                has_sinks = False
            sink = "kafka" if has_sinks else "none"
        self.voice.forget(cmd.name)
        app.start(trigger=trigger, max_records_per_trigger=cmd.max_records, sink=sink)
        # no state word here: RESTORING would stay on screen above a dashboard that says RUNNING
        sources = ", ".join(self._source_topics(app)) or "its sources"
        where = (" (the dashboard below follows it)" if cmd.watch else
                 self._follow(cmd.name, app) or f" (`%statekit watch {cmd.name}` shows it live)")
        say(f"{cmd.name}: started: {self._tasks_on(app)}, reading {sources}{where}")
        if cmd.watch:
            return self._watch(app, cmd.name)

    @staticmethod
    def _refuse_own_code_failure(name: str, app) -> None:
        """An app that failed in its own code (a lambda that raised) fails the same way whenever it
        runs again, restarted or not: say what to do instead."""
        from statekit.errors import ProcessorError, StatekitError

        if str(app.state) == "ERROR" and isinstance(app.error, ProcessorError):
            raise StatekitError(f"app {name!r} failed in its own code ({one_line(app.error)[:200]}): fix "
                                f"the `%%statekit app {name}` cell and run it again (that replaces the "
                                f"failed app), then `%statekit start {name}`")

    def _start_failed(self, cmd: Command, app):
        """`start` of an app in ERROR: restarted (a crash, every instance dead, a query that failed),
        unless its own code failed."""
        self._refuse_own_code_failure(cmd.name, app)
        restart = Command("restart", {"name": cmd.name, "no_watch": not cmd.watch, "restore_rate": None})
        return self.cmd_restart(restart)

    def cmd_stop(self, cmd: Command):
        app = self.app(cmd.name)
        d = self.dashboards.get(cmd.name)
        if d is not None:  # one last picture while the stores are open, then it stays as is
            d.stop(timeout=5)
            try:
                d.refresh(final=True)
            except Exception:
                pass
        app.stop()
        if d is not None:
            d.final(app.state)
        say(f"{cmd.name}: stopped")

    def _retire_dashboard(self, name: str, note: str | None = None) -> None:
        d = self.dashboards.pop(name, None)
        if d is not None:
            d.stop(timeout=3)
            if note is not None:
                d.final("NOT_RUNNING", note=note)

    def _watch(self, app, name: str, interval: float = 1.0, top: int = 15):
        """A new dashboard for `app` (an older one of it stops refreshing and stays as it was)."""
        from kernel_ext.dashboard.view import LiveDashboard

        self._retire_dashboard(name)
        d = LiveDashboard(app, name=name, interval=interval, top=top,
                          history_fn=lambda store, key: self._history(app, store, key),
                          changelog_fn=lambda: self._changelog_stats(app))
        self.dashboards[name] = d
        d.refresh()
        try:   # where a failure is said when this cell is the one output goes to
            notice = Notice(current_cell())
        except ImportError:
            notice = None
        if notice is not None:
            self.voice.notices[name] = notice
            self.display(notice.widget)
        self.display(d.view.root)
        d.start()
        return None

    def _follow(self, name: str, app, show_if_none: bool = False) -> str:
        """The app's dashboard follows again (one dashboard per app: no new one is appended);
        returns a note for the command's line."""
        d = self.dashboards.get(name)
        if d is not None and d.app is app:
            d.start()  # a no-op while it refreshes
            return "; its dashboard above follows it"
        if show_if_none:
            self._watch(app, name)
        return ""

    @staticmethod
    def _tasks_on(app) -> str:
        try:
            tasks = len(app.tasks())
        except Exception:
            tasks = app.partitions
        n = getattr(app, "instances", 1)
        if not hasattr(app, "instances"):
            return f"{tasks} task{'s' * (tasks != 1)} in Spark's own state store"
        if getattr(app, "placement", None) == "executors":   # Spark places them: no instance count
            return f"{tasks} task{'s' * (tasks != 1)} on Spark's executors"
        return f"{tasks} task{'s' * (tasks != 1)} on {n} instance{'s' * (n != 1)}"

    @staticmethod
    def _source_topics(app) -> list[str]:
        """The app's input topics (not its repartition topics), in the order it reads them."""
        try:
            repart = set(getattr(app.plan, "repartition_topics", ()) or ())
            topics = []
            for p in app.subplans.values():
                for t in getattr(p, "source_topics", None) or ():
                    if t not in repart and t not in topics:
                        topics.append(t)
            return topics
        except Exception:
            return []

    def cmd_wait(self, cmd: Command):
        """Say what it waits for, wait until the app has processed and committed every record now
        in its source topics, then say what happened: caught up, or stopped by a crash the user
        asked for (said here once, in words), or failed (one red line)."""
        from statekit.errors import StatekitError

        name, app = cmd.name, self.app(cmd.name)
        sources = self._source_topics(app)
        for topic in sources:   # a producer still writing: the records it will write count too
            job = self.producers.get(topic)
            if job is not None and job.running:
                sent = job.progress.sent if job.progress is not None else 0
                say(f"{name}: waiting for the producer of {topic} to finish ({sent:,} records sent so far)…")
                job.thread.join(cmd.timeout)
        try:
            k = app.kafka
            total = sum(sum(k.end_offsets(t).values()) - sum(k.begin_offsets(t).values()) for t in sources)
            what = f"the {total:,} records in {', '.join(sources)}"
        except Exception:
            what = f"every record in {', '.join(sources) or 'its sources'}"
        d = self.dashboards.get(name)
        shown = " (the dashboard above shows the progress)" if d is not None and d.app is app else ""
        since, t0 = time.time(), time.monotonic()
        if str(app.state) != "ERROR":
            say(f"{name}: waiting until {what} are processed and committed{shown}…")
            try:
                done = app.process_all_available(timeout=cmd.timeout)
            except StatekitError as err:
                if str(app.state) != "ERROR":
                    raise
                if not self._asked_death(app, since - 60):
                    return self._failed(name, app.error or err)
                done = False
            if done:
                say(f"{name}: caught up in {time.monotonic() - t0:.1f} s")
                return None
            if str(app.state) != "ERROR":
                waited = f" after {cmd.timeout:g} s" if cmd.timeout else ""
                raise StatekitError(f"app {name!r} is {app.state} and still behind{waited} "
                                    f"(`%statekit wait {name} --timeout S` waits longer)")
        died = self._asked_death(app, since - 60)
        if died is None:   # not asked for: a failure, said once
            return self._failed(name, app.error or "every instance is dead")
        crash = next((e for e in reversed(app.events(types="crash", since=died.ts - 60))
                      if e.instance == died.instance), None)
        where = ""
        if crash is not None and crash.batch is not None:
            where = (f" in the middle of batch {crash.batch}"
                     + (f" (task {crash.task} had processed {crash.records} of its records)"
                        if crash.task and crash.records is not None else ""))
        verb = "was killed" if died.cause == "kill" else "crashed as asked"
        say(f"{name}: instance {died.instance} {verb}{where}; no instance is left: the app is in "
            f"ERROR until `%statekit restart {name}`")
        return None

    @staticmethod
    def _asked_death(app, since: float):
        """The last instance death since `since` that the user asked for (a crash or a kill)."""
        found = app.wait_for_event(lambda e: e.type == "instance_died" and e.ts >= since, timeout=5) \
            if hasattr(app, "wait_for_event") else None
        deaths = [e for e in app.events(types="instance_died", since=since)] or ([found] if found else [])
        last = deaths[-1] if deaths else None
        return last if last is not None and last.cause in ("crash", "kill") else None

    def cmd_watch(self, cmd: Command):
        return self._watch(self.app(cmd.name), cmd.name, cmd.interval, cmd.top)

    def cmd_crash(self, cmd: Command):
        app = self.app(cmd.name)
        gen0 = getattr(app, "generation", 0)
        rec = app.crash(cmd.mode, instance=cmd.instance, after_records=cmd.after, timeout=60)
        inst = rec.get("instance", cmd.instance)
        what = f"instance {inst}" if inst is not None else "an instance"
        how = {"process": "crashed (its disk is kept)", "disk-loss": "crashed and lost its disk",
               "executor": "crashed with its executor"}.get(cmd.mode, "crashed")
        status = rec.get("status", "")
        note = self._follow(cmd.name, app)
        if status == "pending":
            alone = self._live(app) == str(inst)
            say(f"{cmd.name}: {what} will crash ({cmd.mode}) once one of its tasks has processed "
                f"{cmd.after} record(s) of a batch"
                + (f"; with no other instance the app then stops until `%statekit restart "
                   f"{cmd.name}`" if alone else "; the live instances then take its tasks over")
                + note)
            return
        if status != "applied":
            say(f"{cmd.name}: crash of {what}: {status}{note}")
            return
        live = self._live(app)
        rest = (f"no instance is left: the app is in ERROR until `%statekit restart {cmd.name}`"
                if live == "none" else f"live instances: {live}")
        say(f"{cmd.name}: {what} {how}{self._moves_since(app, gen0)}; {rest}{note}")

    def cmd_restart(self, cmd: Command):
        app = self.app(cmd.name)
        if str(app.state) in ("CREATED", "NOT_RUNNING"):   # never started (redefined), or stopped
            say(f"{cmd.name}: {'not started yet' if str(app.state) == 'CREATED' else 'stopped'}: starting it")
            if cmd.restore_rate:
                app.restore_rate = float(cmd.restore_rate)
            start = Command("start", {"name": cmd.name, "watch": not cmd.no_watch, "trigger": None,
                                      "max_records": None, "sink": None})
            return self.cmd_start(start)
        self._refuse_own_code_failure(cmd.name, app)
        self._ensure_up(spark=app_uses_spark(app))
        kw = {"restore_rate": cmd.restore_rate} if cmd.restore_rate else {}
        gen0 = getattr(app, "generation", 0)
        self.voice.forget(cmd.name)
        rec = app.restart(**kw)
        revived = rec.get("revived")
        what = (f"revived instance{'s' * (len(revived) > 1)} {', '.join(str(i) for i in revived)}" if revived
                else "restarted")
        throttle = f", restores throttled to {cmd.restore_rate:,.0f} records/s" if cmd.restore_rate else ""
        shown = bool(self.dashboards.get(cmd.name)) and self.dashboards[cmd.name].app is app
        note = "" if cmd.no_watch else self._follow(cmd.name, app, show_if_none=True)
        if not cmd.no_watch and not shown:
            note = "; the dashboard below follows the restore"
        say(f"{cmd.name}: {what} (generation {rec.get('generation', '?')}){self._moves_since(app, gen0)}"
            f"{throttle}{note}")

    @staticmethod
    def _moves_since(app, gen0) -> str:
        """The tasks that changed instance in the rebalances after generation `gen0`."""
        moves = [m for r in (getattr(app, "rebalances", None) or []) if r.get("generation", 0) > (gen0 or 0)
                 for m in r.get("moves", [])]
        if not moves:
            return ""
        shown = ", ".join(f"{m['task']} {m['from']}→{m['to']}" for m in moves[:6])
        return f"; {len(moves)} task move(s): {shown}" + (" …" if len(moves) > 6 else "")

    # -- membership -----------------------------------------------------------------------------

    def _membership(self, cmd: Command, what: str, fn) -> None:
        app = self.app(cmd.name)
        if not hasattr(app, "kill"):
            from statekit.errors import StatekitError

            raise StatekitError(f"app {cmd.name!r} runs Spark's own state store (one instance): no "
                                f"membership changes")
        gen0 = app.generation
        result = fn(app)
        note = self._follow(cmd.name, app)
        say(f"{cmd.name}: {what(result)}{self._moves_since(app, gen0)}; live instances: "
            f"{self._live(app)}{note}")

    @staticmethod
    def _live(app) -> str:
        try:
            df = app.instances_frame()
            live = [str(i) for i, st in zip(df["instance"], df["status"]) if st in ("alive", "leaving")]
            return ", ".join(live) or "none"
        except Exception:
            return str(app.instances)

    def cmd_instances(self, cmd: Command):
        app = self.app(cmd.name)
        if not hasattr(app, "instances_frame"):
            say(f"{cmd.name}: one instance (Spark's own state store)")
            return None
        df = app.instances_frame()
        if df.empty:   # a cell run before the start cell
            say(f"{cmd.name}: no instance runs: it is {app.state} (`%statekit start {cmd.name}` starts it)")
            return None
        return df.drop(columns=[c for c in ("reported",) if c in df.columns]).set_index("instance")

    def cmd_kill(self, cmd: Command):
        self._membership(cmd, lambda r: f"instance {cmd.instance} killed",
                         lambda app: app.kill(cmd.instance))

    def cmd_revive(self, cmd: Command):
        disk = not cmd.no_disk
        self._membership(cmd, lambda r: f"instance {cmd.instance} revived "
                                        f"({'with its disk' if disk else 'with an empty disk'})",
                         lambda app: app.revive(cmd.instance, disk=disk))

    def cmd_add_instance(self, cmd: Command):
        self._membership(cmd, lambda i: f"instance {i} joined (warmup replicas catch up before tasks move)",
                         lambda app: app.add_instance())

    def cmd_remove_instance(self, cmd: Command):
        self._membership(cmd, lambda r: f"instance {cmd.instance} left",
                         lambda app: app.remove_instance(cmd.instance))

    def cmd_scale(self, cmd: Command):
        self._membership(cmd, lambda changed: (f"scaled to {cmd.count} instance(s)"
                                               + (f" (changed: {', '.join(str(i) for i in changed)})"
                                                  if changed else " (already there)")),
                         lambda app: app.scale(cmd.count))

    # -- queries ----------------------------------------------------------------------------------

    _key = staticmethod(typed_key)

    def cmd_query(self, cmd: Command):
        return query(self.app(cmd.name), cmd)

    def cmd_lag(self, cmd: Command):
        return self.app(cmd.name).lag()

    def _history(self, app, store: str, key):
        from statekit.history import key_history

        return [(p.offset, p.value, p.batch, p.committed) for p in key_history(app, store, key)]

    def _changelog_stats(self, app) -> list[dict]:
        if self.broker is None:
            return []
        from statekit import broker as broker_mod

        prefix = f"{app.name}-"
        return [s for s in broker_mod.log_stats(self.broker.dir)
                if s["topic"].startswith(prefix) and s["topic"].endswith(CHANGELOG_SUFFIX)]

    def cmd_history(self, cmd: Command):
        from kernel_ext.dashboard.view import HistoryPanel

        app = self.app(cmd.name)
        key = self._key(cmd.key, cmd.key_type)
        panel = HistoryPanel(lambda store, k: self._history(app, store, k))
        panel.load(cmd.store, key)
        self.display(panel.root)
