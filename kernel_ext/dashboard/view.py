"""The dashboard's widgets and `LiveDashboard`, which keeps them live.

Three threads, none of them the kernel's: the app's event reader applies every event to the model
as it arrives (`collect.EventFeed`), a poller asks the app what events do not say
(`collect.Poller`), and the refresh thread draws one `model.Picture` about once a second — at once
after a crash, a state change or a restore's start or end. A refresh only reads the model and
renders: it never waits for the app, the broker or an instance. Only HTML and Image widgets are
updated (no Output-widget capture); hidden tabs are not drawn, the charts only when what they show
changed, so a refresh costs a few milliseconds of the kernel's time whatever the store's size.
"""
from __future__ import annotations

import functools
import threading
import time
from collections import deque
from typing import Callable

import ipywidgets as W

from kernel_ext.dashboard import charts, svg
from kernel_ext.dashboard.collect import ALL_PANELS, EventFeed, Poller
from kernel_ext.dashboard.formats import clip
from kernel_ext.dashboard.model import DashboardModel, Picture, Snapshot
from kernel_ext.dashboard.panels import (CSS, _dash, _e, _pic, as_of, render_changelog, render_events,  # noqa: F401
                                         render_forecast, render_header, render_history, render_instances,
                                         render_moves, render_restore, render_restore_table, render_store,
                                         render_tasks, table)

TERMINAL_STATES = {"NOT_RUNNING"}
TABS = ("tasks", "store", "changelog", "timeline", "topology", "history", "events")


# ---------------------------------------------------------------------------------------------
# widgets


class HistoryPanel:
    """A key's value as of any changelog offset, with a slider over the offsets. `history_fn(store,
    key)` returns [(offset, value-or-None, batch, committed)], rebuilt from the changelog by
    `statekit.history`."""

    def __init__(self, history_fn: Callable | None, stores: list[str] | None = None):
        lay = W.Layout
        self.history_fn = history_fn
        self.key = W.Text(placeholder="key", description="key", layout=lay(width="220px"))
        self.store = W.Dropdown(options=list(stores or []), description="store", layout=lay(width="200px"))
        self.button = W.Button(description="load history", icon="history", layout=lay(width="130px"))
        self.slider = W.IntSlider(value=0, min=0, max=0, description="offset", continuous_update=True,
                                  layout=lay(width="460px"), disabled=True)
        self.out = W.HTML(CSS + "<div class='sk-dash'><div class='sk-empty'>type a key and load its "
                          "history, rebuilt from the changelog</div></div>")
        self.points: list = []
        self._key = None
        self.button.on_click(lambda _b: self.load(self.store.value, self._typed_key()))
        self.slider.observe(self._on_slider, names="value")
        self.root = W.VBox([W.HBox([self.store, self.key, self.button]), self.slider, self.out])

    def _typed_key(self):
        return self.key.value.strip()

    def set_stores(self, names):
        if list(self.store.options) != list(names):
            self.store.options = list(names)

    def load(self, store, key):
        if store is None or key in (None, "") or self.history_fn is None:
            return
        if store not in self.store.options:
            self.store.options = sorted(set(list(self.store.options) + [store]))
        self.store.value = store
        self.key.value = str(key)
        try:
            points = list(self.history_fn(store, key))
            if not points and isinstance(key, str) and key.lstrip("-").isdigit():
                points = list(self.history_fn(store, int(key)))  # an int-keyed store
        except Exception as err:  # shown in the panel, one line
            self.out.value = CSS + f"<div class='sk-dash'><div class='sk-err'>{_e(' '.join(str(err).split()))}</div></div>"
            return
        self.points, self._key = points, key
        self.slider.unobserve(self._on_slider, names="value")
        if points:
            lo, hi = points[0][0], points[-1][0]
            self.slider.min, self.slider.max = 0, 0  # avoid min > max while both move
            self.slider.max = hi
            self.slider.min = lo
            self.slider.value = hi
        self.slider.observe(self._on_slider, names="value")
        self.slider.disabled = len(points) <= 1
        self.out.value = CSS + render_history(key, points, self.slider.value)

    def _on_slider(self, change):
        if self._key is not None:
            self.out.value = CSS + render_history(self._key, self.points, change["new"])


class RestoreReplay:
    """The restore timeline of a round, and a replay of it: a slider (and a play button) over the
    round's seconds; at each position the timeline has a cursor and the table below shows every
    task as it was then (`RestoreRound.at`)."""

    STEP = 0.1  # seconds per slider step
    REDRAW_S = 1.0

    def __init__(self, model: DashboardModel):
        lay = W.Layout
        self.model = model
        self.rounds = W.Dropdown(options=[], layout=lay(width="250px"), description="round",
                                 style={"description_width": "42px"})
        self.slider = W.IntSlider(value=0, min=0, max=1, description="t (0.1 s)", readout=False,
                                  continuous_update=True, layout=lay(width="260px"),
                                  style={"description_width": "62px"})
        self.play = W.Play(value=0, min=0, max=1, step=1, interval=100, layout=lay(width="90px"))
        W.jslink((self.play, "value"), (self.slider, "value"))
        self.clock = W.HTML()
        self.image = W.HTML(layout=lay(max_width="100%"))   # inline SVG
        self.table = W.HTML()
        self.root = W.VBox([W.HBox([self.rounds, self.play, self.slider, self.clock],
                                   layout=lay(flex_flow="row wrap", align_items="center")),
                            self.image, self.table])
        self._sig = None
        self._drawn_at = 0.0
        self._replaying = False
        self.rounds.observe(self._on_round, names="value")
        self.slider.observe(self._on_slider, names="value")

    def _round(self):
        """The chosen round, as a copy the event thread does not change under the drawing."""
        with self.model.lock:
            rs = self.model.restores.rounds
            i = self.rounds.value
            rnd = rs[i] if isinstance(i, int) and 0 <= i < len(rs) else (rs[-1] if rs else None)
            return rnd.frozen() if rnd is not None else None

    def refresh(self, force: bool = False) -> None:
        """Follow the latest round (cheap when nothing changed; a running round is drawn again
        at most every `REDRAW_S`)."""
        with self.model.lock:
            rs = self.model.restores.rounds
            opts = [(f"{time.strftime('%H:%M:%S', time.localtime(r.started))} · {len(r.rows)} task(s)"
                     + ("" if r.final else " · running"), i) for i, r in enumerate(rs)]
        if opts != list(self.rounds.options):
            follow = self.rounds.value is None or self.rounds.value == len(self.rounds.options) - 1
            self.rounds.options = opts
            if follow and opts:
                self.rounds.value = opts[-1][1]
        rnd = self._round()
        sig = (rnd.started if rnd else None, len(rnd.events) if rnd else 0, rnd.final if rnd else None)
        if sig == self._sig and not force:
            return
        now = time.monotonic()
        if (not force and rnd is not None and not rnd.final and self._sig is not None
                and self._sig[0] == sig[0] and now - self._drawn_at < self.REDRAW_S):
            return
        self._sig, self._drawn_at = sig, now
        end = self._end(rnd)
        steps = max(1, int(round((end - rnd.started) / self.STEP)) + 1) if rnd else 1
        self.play.max = self.slider.max = steps
        if not self._replaying:
            self.slider.value = steps
            self._draw(rnd, None)

    @staticmethod
    def _end(rnd) -> float:
        if rnd is None:
            return 0.0
        end = rnd.finished or rnd.started
        for r in rnd.rows.values():
            for t in (r.finished, r.started, r.queued_at):
                if t is not None:
                    end = max(end, t)
        return end if rnd.final else max(end, time.time())

    def _draw(self, rnd, cursor: float | None) -> None:
        view = rnd.at(rnd.started + cursor) if (rnd is not None and cursor is not None) else rnd
        end = self._end(rnd)
        self.image.value = svg.restore_timeline(rnd, cursor=cursor, now=end if not (rnd and rnd.final) else None)
        if view is None:
            self.table.value = CSS + _dash("<div class='sk-empty'>no restore yet</div>")
            self.clock.value = ""
            return
        self.table.value = CSS + _dash(render_restore_table(view, rnd.forecast))
        at = cursor if cursor is not None else (end - rnd.started)
        self.clock.value = f"<span class='sk-note'>t = {at:.1f} s of {end - rnd.started:.1f} s</span>"

    def _on_round(self, change) -> None:
        self._sig = None
        self._replaying = False
        self.refresh(force=True)

    def _on_slider(self, change) -> None:
        rnd = self._round()
        if rnd is None:
            return
        self._replaying = change["new"] < self.slider.max
        self._draw(rnd, change["new"] * self.STEP if self._replaying else None)


class DashboardView:
    """The widget tree. `render(model)` updates it; safe to call from a background thread."""

    def __init__(self, name: str, model: DashboardModel, history_fn: Callable | None = None,
                 on_stop: Callable | None = None, topology: tuple | None = None):
        self.name = name
        self.model = model
        self.history_fn = history_fn
        self._on_stop = on_stop
        lay = W.Layout
        self.header = W.HTML(layout=lay(width="100%"))
        self.lag = W.HTML(layout=lay(width="441px", flex="0 0 auto"))          # inline SVG
        self.ownership = W.HTML(layout=lay(width="441px"))
        self.moves = W.HTML(layout=lay(width="441px"))
        self.ownership_box = W.VBox([self.ownership, self.moves], layout=lay(flex="0 0 auto", width="441px"))
        self.restore = W.HTML(layout=lay(flex="1 1 640px", min_width="0", width="auto"))
        self.instances = W.HTML(layout=lay(flex="1 1 320px", min_width="0", width="auto"))
        self.tasks = W.HTML(layout=lay(width="100%"))
        self.store = W.HTML(layout=lay(width="100%"))
        self.changelog = W.HTML(layout=lay(width="100%"))
        self.events = W.HTML(layout=lay(width="100%"))
        self.topology = W.Image(format="png", layout=lay(max_width="100%"))
        self.replay = RestoreReplay(model)
        self.store_pick = W.Dropdown(options=[], layout=lay(width="150px"))
        self.sort = W.ToggleButtons(options=[("by value", "value"), ("recent", "recency"), ("by key", "key")],
                                    value=model.sort_by, style={"button_width": "76px"},
                                    tooltips=["largest values first", "most recently changed first", "key order"])
        self.filter = W.Text(placeholder="filter keys…", layout=lay(width="150px"))
        self.stop_button = W.Button(description="stop refreshing", icon="stop", layout=lay(width="150px"),
                                    button_style="")
        self.status = W.HTML()
        self.history = HistoryPanel(history_fn)

        self.store_pick.observe(self._on_store, names="value")
        self.sort.observe(self._on_sort, names="value")
        self.filter.observe(self._on_filter, names="value")
        self.stop_button.on_click(lambda _b: self.stop())

        wrap = dict(flex_flow="row wrap", align_items="flex-start", width="100%")
        self.charts = W.HBox([self.lag, self.ownership_box], layout=lay(margin="6px 0 0 0", **wrap))
        self.panels = W.HBox([self.restore, self.instances], layout=lay(**wrap))
        for box in (self.charts, self.panels):
            box.add_class("sk-row")  # gaps between wrapped panels (CSS below)
        controls = W.HBox([self.store_pick, self.sort, self.filter],
                          layout=lay(align_items="center", flex_flow="row wrap"))
        store_tab = W.VBox([controls, self.store])
        self.tabs = W.Tab(children=[self.tasks, store_tab, self.changelog, self.replay.root, self.topology,
                                    self.history.root, self.events], layout=lay(margin="6px 0 0 0"))
        for i, t in enumerate(("Tasks", "Store", "Changelog", "Restore timeline", "Topology",
                               "Key history", "Events")):
            self.tabs.set_title(i, t)
        self.tabs.observe(lambda _c: self._render_tab(), names="selected_index")
        self.picture: Picture | None = None   # the one drawn last (the tab callbacks redraw from it)
        self.costs: dict = {}                  # part -> seconds its last drawing took
        self._pending: dict | None = None      # a render's panel values, sent at its end (`render`)
        footer = W.HBox([self.stop_button, self.status], layout=lay(align_items="center"))
        self.root = W.VBox([self.header, self.charts, self.panels, self.tabs, footer],
                           layout=lay(width="100%", padding="4px"))
        self.root.add_class("statekit-dashboard")
        self._stopped = False
        self._lag_sig = None
        self._lag_at = 0.0
        self._own_sig = None
        self._own_at = 0.0
        self._topology = topology   # drawn when its tab first shows (a whole figure: not in the cell)

    # -- callbacks ------------------------------------------------------------------------------

    def _on_store(self, change):
        if change["new"]:
            self.model.store = change["new"]
            self.store.value = render_store(self.model.picture())

    def _on_sort(self, change):
        self.model.sort_by = change["new"]
        self.store.value = render_store(self.model.picture())

    def _on_filter(self, change):
        self.model.key_filter = change["new"] or ""
        self.store.value = render_store(self.model.picture())

    @property
    def visible(self) -> set:
        """The tab that shows (the others are neither read nor drawn)."""
        i = self.tabs.selected_index
        return {TABS[i]} if isinstance(i, int) and 0 <= i < len(TABS) else set()

    def show_history(self, store: str, key):
        """Open the Key history tab on `key`."""
        self.tabs.selected_index = 5
        self.history.load(store, key)

    # -- rendering ------------------------------------------------------------------------------

    def set_topology(self, nodes, edges):
        self._topology = None
        self.topology.value = charts.to_png(charts.topology_figure(nodes, edges, title=f"{self.name}: topology"), dpi=90)

    def render_header(self, m=None, note: str = "") -> None:
        self.header.value = render_header(self.name, _pic(m or self.model), note)

    def _set(self, widget, value) -> None:
        pending = self._pending
        if pending is None:
            if widget.value != value:
                widget.value = value
        elif (pending[id(widget)][1] if id(widget) in pending else widget.value) != value:
            pending[id(widget)] = (widget, value)

    def _timed(self, part: str, fn):
        t = time.perf_counter()
        out = fn()
        self.costs[part] = time.perf_counter() - t
        return out

    def _render_tab(self) -> None:
        p = self.picture if self.picture is not None else self.model.picture()
        i = self.tabs.selected_index
        if i == 0:
            self._set(self.tasks, self._timed("tasks", lambda: render_tasks(p)))
        elif i == 2:
            self._set(self.changelog, self._timed("changelog", lambda: render_changelog(p)))
        elif i == 3:
            self._timed("timeline", self.replay.refresh)
        elif i == 4 and self._topology is not None:
            self._timed("topology", lambda: self.set_topology(*self._topology))
        elif i == 6:
            self._set(self.events, self._timed("events", lambda: render_events(p)))

    def render(self, m=None, note: str = "", charts_too: bool = True) -> None:
        """Draw one picture (a model: the picture it gives now): every panel from the same one.
        The panels' new values are sent together once all are drawn: the page then lays out and
        paints the refresh once, not once per panel as each message came in (a browser drew ~9
        frames a second for a refresh a second, on the cores a restore it showed was using)."""
        self._pending = {}
        try:
            self._render(m, note, charts_too)
        finally:
            pending, self._pending = self._pending, None
            for widget, value in pending.values():
                widget.value = value

    def _render(self, m, note: str, charts_too: bool) -> None:
        p = _pic(m or self.model)
        self.picture = p
        self._set(self.header, self._timed("header", lambda: render_header(self.name, p, note)))
        names = p.store_names
        if list(self.store_pick.options) != names:
            self.store_pick.options = names
            if p.store in names:
                self.store_pick.value = p.store
            self.history.set_stores(names)
        self._set(self.store, self._timed("store", lambda: render_store(p)))  # the "changed" marks
        self._set(self.restore, self._timed("restore", lambda: render_restore(p)))
        inst = self._timed("instances", lambda: render_instances(p))
        self._set(self.instances, inst)
        self.instances.layout.display = None if inst else "none"
        self._render_tab()
        if charts_too:
            self._timed("lag chart", lambda: self._render_lag(p))
            self._timed("ownership chart", lambda: self._render_ownership(p))

    CHART_EVERY = 5.0   # seconds: a chart whose data did not change is drawn again this often (time goes on)

    def _render_lag(self, p: Picture) -> None:
        """Drawn when a task's lag or a marker changed, else every `CHART_EVERY` s."""
        sig = (tuple((t, tuple(ys[-120:])) for t, (_xs, ys) in p.lag.items()),
               tuple((t, tuple(ys[-120:])) for t, (_xs, ys) in p.standby_lag.items()), tuple(p.markers),
               tuple((round(a), round(b), label) for a, b, label in p.outages))
        if sig == self._lag_sig and p.t - self._lag_at < self.CHART_EVERY:
            return
        self._lag_sig, self._lag_at = sig, p.t
        self._set(self.lag, svg.lag_chart(p.lag, p.standby_lag, p.markers, p.outages))

    def _render_ownership(self, p: Picture) -> None:
        """Drawn when the ownership changed, else every `CHART_EVERY` s while the app runs (the
        bars grow)."""
        own = p.ownership
        if not own.segments:
            self.ownership_box.layout.display = "none"
            return
        self.ownership_box.layout.display = None
        self._set(self.moves, render_moves(p))
        running = p.state in ("RUNNING", "RESTORING", "REBALANCING", "WAITING")
        if own.version == self._own_sig and (not running or p.t - self._own_at < self.CHART_EVERY):
            return
        self._own_sig, self._own_at = own.version, p.t
        t0 = min(x for x in (p.t0, own.t0) if x is not None)
        self._set(self.ownership, svg.ownership_chart(own, t0, p.t))

    def set_status(self, text: str):
        self.status.value = f"<span class='sk-note' style='font-family:sans-serif'>{_e(text)}</span>"

    @property
    def closed(self) -> bool:
        return self._stopped or getattr(self.root, "comm", True) is None

    def stop(self):
        self._stopped = True
        self.stop_button.disabled = True
        if self._on_stop is not None:
            self._on_stop()

    def _ipython_display_(self):
        from IPython.display import display

        display(self.root)




def _no_wait(forecast):
    """``restore_forecast`` as the dashboard calls it: never waiting for a quiet machine to
    calibrate on (the forecast of a busy machine stands until a quiet one is measured)."""
    import inspect

    if not callable(forecast):
        return None
    try:
        takes = "settle" in inspect.signature(forecast).parameters
    except (TypeError, ValueError):
        takes = False
    return functools.partial(forecast, settle=0.0) if takes else forecast


class LiveDashboard:
    """Events → model (as they arrive), polls → model (a thread of its own), model → picture → view
    (the refresh thread: every `interval` seconds, and at once after an urgent event, at most every
    `min_gap` seconds: a restore of four tasks brings a dozen urgent events in a second, and a
    browser that redrew the page ten times a second for them took the cores the restore needed).

    Stops when the app is stopped (NOT_RUNNING), when the view is closed or its stop button is
    pressed, or on `stop()`; in ERROR it keeps the last picture and goes on refreshing the light
    panels, so a `restart()` from Python shows up too. `refresh()` polls and draws once,
    synchronously (tests, `%statekit stop`); `redraw()` is one refresh of the picture alone (what the
    thread does); `follow()` starts the threads again after they stopped."""

    def __init__(self, app, name: str | None = None, interval: float = 1.0, top: int = 15,
                 history_fn: Callable | None = None, changelog_fn: Callable | None = None,
                 stores: list[str] | None = None, max_rows: int = 2000, view: bool = True,
                 heavy_interval: float = 5.0, min_gap: float = 0.25):
        self.app = app
        self.name = name or getattr(app, "name", "app")
        self.interval = interval
        self.min_gap = min_gap
        self.model = DashboardModel(top_k=top, name=self.name)
        self.model.live = True
        self._wake = threading.Event()
        self.feed = EventFeed(app, self.model, wake=self._wake.set)
        self.view = None
        if view:
            self.view = DashboardView(self.name, self.model, history_fn=history_fn, on_stop=self._stop_set,
                                      topology=self._topology(app))
        self.poller = Poller(app, self.model, stores=stores, max_rows=max_rows, changelog_fn=changelog_fn,
                             forecast_fn=_no_wait(getattr(app, "restore_forecast", None)),
                             interval=interval, heavy_interval=heavy_interval, visible=self._visible,
                             feed=self.feed)
        self.store_cache = self.poller.cache
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fed = False
        self.refreshes = 0
        self.last_refresh_s = 0.0
        self.refresh_times: deque = deque(maxlen=10_000)   # seconds per refresh of the picture (wall)
        self.cpu_s = 0.0  # CPU time spent refreshing (the refresh thread's), for the benchmark
        self.last_picture: Picture | None = None
        self.observers: list[Callable[[Picture], None]] = []   # called with every picture drawn
        self.last_error: str | None = None  # traceback of the last failed refresh
        self.stop_reason: str | None = None
        self.gone_note: str | None = None   # why it follows the app no more (final(note=...))

    def _stop_set(self) -> None:
        self._stop.set()
        self._wake.set()

    @staticmethod
    def _topology(app):
        try:
            plan = getattr(app, "plan", None)
            d = plan.describe(getattr(app, "name", "app")) if plan is not None else app.describe()
            if isinstance(d, dict) and plan is None:
                d = dict(d, app=getattr(app, "name", "app"))
            return charts.graph_from_describe(d)
        except Exception:  # the topology panel stays empty
            return None

    def _visible(self) -> set:
        return ALL_PANELS if self.view is None else self.view.visible

    def _feed_once(self) -> None:
        if not self._fed:
            self._fed = True
            self.feed.resume()

    # -- one refresh -------------------------------------------------------------------------

    def redraw(self) -> Picture:
        """One refresh: the model's picture, drawn. Reads memory only (never the app)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        self.model.sample()
        pic = self.model.picture()
        if self.view is not None:
            self.view.render(pic)
        self.last_picture = pic
        self.refreshes += 1
        self.last_refresh_s = time.perf_counter() - t0
        self.refresh_times.append(self.last_refresh_s)
        self.cpu_s += time.thread_time() - c0
        for fn in list(self.observers):
            fn(pic)
        return pic

    def refresh(self, final: bool = False) -> Snapshot:
        """Poll everything now (the stores too, whatever tab shows), then redraw; ``final``: the
        last picture before the app stops (its forecast's records counted again if it committed
        since)."""
        self._feed_once()
        snap = self.poller.poll(force=True, final=final)
        self.redraw()
        return snap

    # -- the threads -------------------------------------------------------------------------

    def _loop(self):
        import traceback

        terminal_since = None
        failures = 0
        reason = "stopped"
        last = 0.0
        while not self._stop.is_set():
            woke = self._wake.wait(max(0.0, self.interval - (time.monotonic() - last)))
            self._wake.clear()
            if self._stop.is_set():
                break
            if woke and time.monotonic() - last < self.min_gap:
                self._stop.wait(self.min_gap - (time.monotonic() - last))
            last = time.monotonic()
            try:
                pic = self.redraw()
                failures = 0
                if pic.state in TERMINAL_STATES:
                    terminal_since = terminal_since or time.monotonic()
                else:
                    terminal_since = None
                if self.view is not None:
                    self.view.set_status(f"refreshed {time.strftime('%H:%M:%S')} · every {self.interval:g} s "
                                         f"and at once on a crash or a restore · "
                                         f"{self.last_refresh_s * 1000:.0f} ms per refresh")
            except Exception as err:  # never let the thread die silently; keep trying
                failures += 1
                self.last_error = traceback.format_exc()
                if self.view is not None:
                    try:
                        self.view.set_status(f"refresh failed ({failures}x): {type(err).__name__}: "
                                             f"{clip(err, 200)}")
                    except Exception:
                        pass
                if failures >= 30:
                    reason = f"stopped after {failures} failed refreshes ({type(err).__name__}: {clip(err, 200)})"
                    break
            if self.view is not None and self.view.closed:
                reason = "the dashboard was closed"
                break
            if terminal_since is not None and time.monotonic() - terminal_since >= 1.5 * self.interval:
                reason = f"the app is {self.last_picture.state}"
                break
        self.stop_reason = reason
        self.poller.stop(timeout=2)
        self.feed.close()
        self._fed = False
        if self.view is not None:
            try:
                self.view.stop_button.disabled = True
                self.view.set_status(f"stopped refreshing at {time.strftime('%H:%M:%S')}: {reason} "
                                     f"(`%statekit watch {self.name}` to follow it again)")
            except Exception:
                pass

    def start(self) -> "LiveDashboard":
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._feed_once()
            if self.view is not None:
                self.view._stopped = False
                self.view.stop_button.disabled = False
            self.poller.start()
            self._thread = threading.Thread(target=self._loop, name=f"statekit-dashboard-{self.name}",
                                            daemon=True)
            self._thread.start()
        return self

    follow = start

    def stop(self, timeout: float = 5.0) -> None:
        """Stop refreshing. If the app stops within a while (as `%statekit down` does right after),
        the last picture says so (no "4 alive" on a stopped app)."""
        self._stop_set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self.poller.stop(min(timeout, 1.0))   # a poll stuck in a call ends on its own (a daemon)
        self.feed.close()
        self._fed = False
        threading.Thread(target=self._watch_for_stop, daemon=True,
                         name=f"statekit-dashboard-final-{self.name}").start()

    def _watch_for_stop(self, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline and not (self._thread is not None and self._thread.is_alive()):
            try:
                st = str(getattr(self.app.state, "value", self.app.state))
            except Exception:
                return
            if st in TERMINAL_STATES:
                shown = self.last_picture.state if self.last_picture is not None else None
                if shown != st:
                    self.final(st)
                return
            time.sleep(0.25)

    def final(self, state, note: str | None = None) -> None:
        """After the app stopped: show its last state without asking it anything (its stores are
        closed): no instance alive, no task live. ``note``: why this dashboard follows it no more
        (the app was redefined, the kernel is going away), in the header and the status line; it
        stays for every later final picture."""
        note = self.gone_note = note or self.gone_note
        self.model.final(state)
        self.last_picture = pic = self.model.picture()
        if self.view is not None:
            self.view.render(pic, note=note or "", charts_too=False)
            err = f"; last refresh error: {self.last_error.strip().splitlines()[-1]}" if self.last_error else ""
            self.view.set_status(f"stopped refreshing: {note}" if note else
                                 f"stopped refreshing: the app is {pic.state} "
                                 f"(`%statekit start {self.name}` or `restart` to run it again){err}")

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _ipython_display_(self):
        from IPython.display import display

        display(self.view.root)
