"""The topology as a plain graph: nodes, store declarations, windows and a few serdes of its own.

Nothing here runs a record; `plan.py` compiles this graph into what engines run. Node names follow
Kafka Streams (`KSTREAM-MAP-0000000003`) so a `describe()` reads like `Topology#describe()`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from statekit.errors import TopologyError
from statekit.topology.serdes import WindowedSerde  # noqa: F401  (re-exported: its old home)

# node kinds -------------------------------------------------------------------------------------
SOURCE = "source"                 # a topic read (stream or table role; or a repartition topic)
TABLE_SOURCE = "table_source"     # materializes a table topic into its kv store
MAP = "map"
MAP_VALUES = "map_values"
FILTER = "filter"
FLAT_MAP = "flat_map"
FLAT_MAP_VALUES = "flat_map_values"
PEEK = "peek"
MERGE = "merge"                   # two streams into one (also the output of a stream-stream join)
KEY_SELECT = "key_select"         # group_by(fn): the new key, before the shuffle
AGGREGATE = "aggregate"           # count / reduce / aggregate into a kv store
WINDOW_AGGREGATE = "window_aggregate"
SESSION_AGGREGATE = "session_aggregate"
SLIDING_AGGREGATE = "sliding_aggregate"
JOIN = "join"                     # stream-table join (reads the table's store)
STREAM_JOIN = "stream_join"       # one side of a stream-stream windowed join (params["side"])
TABLE_JOIN = "table_join"         # one side of a table-table join (params["side"])
TABLE_MERGE = "table_merge"       # the result table of a table-table join
TABLE_GROUP_BY = "table_group_by" # table.group_by(fn): each change becomes subtract/add records
TABLE_AGGREGATE = "table_aggregate"   # re-aggregation of a grouped table (adder + subtractor)
SUPPRESS = "suppress"             # holds table updates back in a buffer store
FK_SEND = "fk_send"               # foreign-key join: the left table's subscriptions, keyed by fk
FK_RECEIVE = "fk_receive"         # ... stored by (fk, pk) beside the foreign table, answered
FK_FOREIGN = "fk_foreign"         # ... a foreign table change answers every subscriber
FK_RESPONSE = "fk_response"       # ... the answer checked against the current left value
PROCESS = "process"               # processor API
TABLE_FILTER = "table_filter"
TABLE_MAP_VALUES = "table_map_values"
TO_STREAM = "to_stream"
SINK = "sink"

KS_NAMES = {
    SOURCE: "KSTREAM-SOURCE", TABLE_SOURCE: "KTABLE-SOURCE", MAP: "KSTREAM-MAP",
    MAP_VALUES: "KSTREAM-MAPVALUES", FILTER: "KSTREAM-FILTER", FLAT_MAP: "KSTREAM-FLATMAP",
    FLAT_MAP_VALUES: "KSTREAM-FLATMAPVALUES", PEEK: "KSTREAM-PEEK", MERGE: "KSTREAM-MERGE",
    KEY_SELECT: "KSTREAM-KEY-SELECT",
    AGGREGATE: "KSTREAM-AGGREGATE", WINDOW_AGGREGATE: "KSTREAM-WINDOWED-AGGREGATE",
    SESSION_AGGREGATE: "KSTREAM-SESSION-AGGREGATE", SLIDING_AGGREGATE: "KSTREAM-SLIDING-AGGREGATE",
    JOIN: "KSTREAM-JOIN", STREAM_JOIN: "KSTREAM-JOINTHIS", TABLE_JOIN: "KTABLE-JOINTHIS",
    TABLE_MERGE: "KTABLE-MERGE", TABLE_GROUP_BY: "KTABLE-SELECT", TABLE_AGGREGATE: "KTABLE-AGGREGATE",
    SUPPRESS: "KTABLE-SUPPRESS", FK_SEND: "KTABLE-FK-JOIN-SUBSCRIPTION-REGISTRATION",
    FK_RECEIVE: "KTABLE-FK-JOIN-SUBSCRIPTION-PROCESSOR", FK_FOREIGN: "KTABLE-FK-JOIN-FOREIGN",
    FK_RESPONSE: "KTABLE-FK-JOIN-SUBSCRIPTION-RESPONSE-RESOLVER",
    PROCESS: "KSTREAM-PROCESSOR", TABLE_FILTER: "KTABLE-FILTER",
    TABLE_MAP_VALUES: "KTABLE-MAPVALUES", TO_STREAM: "KTABLE-TOSTREAM", SINK: "KSTREAM-SINK",
}

# Steps that need their input partitioned by their key: they keep state per key, or must meet the
# records of another input (a join) or a store (a lookup) in the same task. A key change inside a
# task before one of them goes through a repartition topic.
KEY_DEPENDENT = {TABLE_SOURCE, AGGREGATE, WINDOW_AGGREGATE, SESSION_AGGREGATE, SLIDING_AGGREGATE,
                 JOIN, STREAM_JOIN, TABLE_JOIN, TABLE_AGGREGATE, FK_RECEIVE, FK_FOREIGN, FK_RESPONSE}
# Steps whose output key may differ from their input key.
KEY_CHANGING = {MAP, FLAT_MAP, KEY_SELECT, PROCESS, WINDOW_AGGREGATE, SESSION_AGGREGATE,
                SLIDING_AGGREGATE, TABLE_GROUP_BY, FK_SEND, FK_RECEIVE, FK_FOREIGN}
# Steps whose output is a table: they forward changes (new value, old value), not plain values.
TABLE_KINDS = {TABLE_SOURCE, AGGREGATE, WINDOW_AGGREGATE, SESSION_AGGREGATE, SLIDING_AGGREGATE,
               TABLE_FILTER, TABLE_MAP_VALUES, TABLE_JOIN, TABLE_MERGE, TABLE_GROUP_BY,
               TABLE_AGGREGATE, SUPPRESS, FK_RESPONSE}
# Windowed tables (keys carry their window) and the grace that closes their windows.
WINDOWED_KINDS = {WINDOW_AGGREGATE, SESSION_AGGREGATE, SLIDING_AGGREGATE}

_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,180}$")


def check_name(what: str, name: Any) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise TopologyError(f"{what} {name!r} is not a valid name: use 1-180 characters among "
                            f"letters, digits, '.', '_' and '-' (it becomes part of a topic name)")
    return name


@dataclass
class Node:
    """One step of the topology. `parent` is the node whose records flow in (None for sources;
    merges have `extra_parents` too); `table` is the table a join reads (not a flow edge); `stores`
    the stores the step uses."""

    name: str
    kind: str
    parent: Optional["Node"] = None
    children: list = field(default_factory=list)
    fn: Any = None                       # the user function(s) of the step
    params: dict = field(default_factory=dict)
    stores: list = field(default_factory=list)   # StoreDecls (names resolved at compile())
    table: Optional["Node"] = None       # the table node this step reads (a lookup, not a flow)
    extra_parents: list = field(default_factory=list)  # merges: the other inputs
    key_serde: Any = "str"               # serdes of the records this node emits
    value_serde: Any = "str"
    origin: str = ""                     # the source topic this lineage started from (naming)

    def parents(self) -> list:
        return ([self.parent] if self.parent is not None else []) + list(self.extra_parents)

    def __repr__(self) -> str:
        return f"Node({self.name})"


# store declarations ------------------------------------------------------------------------------

@dataclass
class StoreDecl:
    """A store the topology declares; becomes a `statekit.stores.StoreSpec` at compile().

    `name=None` means "name it for me" (resolved at compile, after every explicit name is known)."""

    name: Optional[str]
    kind: str = "kv"                     # "kv" | "window" | "session" | "buffer"
    key_serde: Any = None                # None: the step's serde (aggregations), else json
    value_serde: Any = None
    backend: str = "rocksdb"
    caching: bool = True
    logging: bool = True
    retention_ms: Optional[int] = None
    window_size_ms: Optional[int] = None
    segment_ms: Optional[int] = None
    auto_hint: str = ""                  # basis of an auto-generated name
    owner: str = ""                      # the node that declared it

    def to_spec(self):
        from statekit.stores import StoreSpec

        kw = dict(kind=self.kind,
                  key_serde="json" if self.key_serde is None else self.key_serde,
                  value_serde="json" if self.value_serde is None else self.value_serde,
                  backend=self.backend, caching=self.caching, logging=self.logging)
        if self.kind == "window":
            kw.update(retention_ms=self.retention_ms, window_size_ms=self.window_size_ms,
                      segment_ms=self.segment_ms)
        elif self.kind == "session":
            kw.update(retention_ms=self.retention_ms, segment_ms=self.segment_ms)
        return StoreSpec(self.name, **kw)


def kv_store(name: str, key_serde: Any = None, value_serde: Any = None, *, backend: str = "rocksdb",
             caching: bool = True, logging: bool = True) -> StoreDecl:
    """A key-value store for `KStream.process(..., stores=[kv_store("x")])` or `store=` arguments.
    Serdes left None: an aggregation's own (its key's serde, e.g. int64 counts), json elsewhere."""
    return StoreDecl(check_name("store", name), "kv", key_serde, value_serde, backend, caching, logging)


def window_store(name: str, size_ms: int, retention_ms: Optional[int] = None, key_serde: Any = None,
                 value_serde: Any = None, *, backend: str = "rocksdb", caching: bool = True,
                 logging: bool = True, segment_ms: Optional[int] = None) -> StoreDecl:
    """A window store (a value per (key, window_start)); retention defaults to one day or the size."""
    size_ms = int(size_ms)
    if size_ms <= 0:
        raise TopologyError(f"window store {name!r}: size_ms must be > 0, got {size_ms}")
    if retention_ms is None:
        retention_ms = max(size_ms, 86_400_000)
    return StoreDecl(check_name("store", name), "window", key_serde, value_serde, backend, caching,
                     logging, int(retention_ms), size_ms, segment_ms)


def session_store(name: str, retention_ms: Optional[int] = None, key_serde: Any = None,
                  value_serde: Any = None, *, backend: str = "rocksdb", caching: bool = True,
                  logging: bool = True, segment_ms: Optional[int] = None) -> StoreDecl:
    """A session store (a value per (key, start, end)) for session-windowed aggregations; the
    retention defaults to the windows' inactivity gap + grace and may not be shorter."""
    if retention_ms is not None and int(retention_ms) <= 0:
        raise TopologyError(f"session store {name!r}: retention_ms must be > 0, got {retention_ms}")
    return StoreDecl(check_name("store", name), "session", key_serde, value_serde, backend, caching,
                     logging, None if retention_ms is None else int(retention_ms), None, segment_ms)


def store_spec(name: str, kind: str = "kv", **kw) -> StoreDecl:
    """Generic helper: `store_spec("x")`, `store_spec("w", kind="window", size_ms=60_000)`,
    `store_spec("s", kind="session")`."""
    if kind == "kv":
        return kv_store(name, **kw)
    if kind == "window":
        return window_store(name, **kw)
    if kind == "session":
        return session_store(name, **kw)
    raise TopologyError(f"store {name!r}: kind must be 'kv', 'window' or 'session', got {kind!r}")


def as_decl(store: Any, **defaults) -> StoreDecl:
    """`store=` arguments: None (auto name), a name, a StoreDecl or a statekit.stores.StoreSpec."""
    if store is None:
        return StoreDecl(None, **defaults)
    if isinstance(store, str):
        return StoreDecl(check_name("store", store), **defaults)
    if isinstance(store, StoreDecl):
        import dataclasses

        fill = {k: v for k, v in defaults.items()
                if k in ("key_serde", "value_serde") and getattr(store, k) is None}
        return dataclasses.replace(store, **fill) if fill else store
    if hasattr(store, "name") and hasattr(store, "kind"):  # a stores.StoreSpec
        return StoreDecl(check_name("store", store.name), store.kind,
                         getattr(store, "key_serde", "json"), getattr(store, "value_serde", "json"),
                         getattr(store, "backend", "rocksdb"), getattr(store, "caching", True),
                         getattr(store, "logging", True), getattr(store, "retention_ms", None),
                         getattr(store, "window_size_ms", None), getattr(store, "segment_ms", None))
    raise TopologyError(f"store must be a name, kv_store(...)/window_store(...) or a StoreSpec, "
                        f"got {type(store).__name__}")


# windows ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TimeWindows:
    """Tumbling (advance == size) or hopping windows, aligned to the epoch: [start, start + size)."""

    size_ms: int
    advance_ms: int

    @property
    def kind(self) -> str:
        return "tumbling" if self.advance_ms == self.size_ms else "hopping"

    def starts(self, ts: int) -> list:
        """Window starts containing `ts`, ascending."""
        size, adv = self.size_ms, self.advance_ms
        last = ts - ts % adv
        first = max(0, last - ((size - 1) // adv) * adv)
        out = []
        s = first
        while s <= last:
            if s + size > ts:
                out.append(s)
            s += adv
        return out

    def describe(self) -> str:
        if self.kind == "tumbling":
            return f"tumbling({self.size_ms}ms)"
        return f"hopping({self.size_ms}ms every {self.advance_ms}ms)"

    def end(self, start: int) -> int:
        return start + self.size_ms


GRACE_HINT = ("the grace period is how long after its end a window still takes late records: "
              "pass 0 or more")


def _ms(what: str, value: Any, minimum: int = 0, hint: str = "") -> int:
    tail = f"; {hint}" if hint else ""
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise TopologyError(f"{what} must be a number of milliseconds, got {value!r}{tail}") from None
    if v < minimum or v != value:
        raise TopologyError(f"{what} must be an integer >= {minimum} ms, got {value!r}{tail}")
    return v


@dataclass(frozen=True)
class JoinWindows:
    """A stream-stream join's window: a record at time t joins the other side's records with the
    same key and timestamps in [t - before_ms, t + after_ms] (the other side sees it the other way
    round); `grace_ms` is how long after a window ends late records still join and unmatched
    left/outer results wait (Kafka Streams' JoinWindows). `JoinWindows.of(ms)` is symmetric."""

    before_ms: int
    after_ms: int
    grace_ms: int = 0

    def __post_init__(self) -> None:
        for f in ("before_ms", "after_ms"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool):
                raise TopologyError(f"JoinWindows {f} must be an integer number of ms, got {v!r}")
        if self.before_ms + self.after_ms < 0:
            raise TopologyError(f"JoinWindows needs before_ms + after_ms >= 0, got "
                                f"{self.before_ms} + {self.after_ms}")
        _ms("JoinWindows grace_ms", self.grace_ms, hint=GRACE_HINT)

    @classmethod
    def of(cls, difference_ms: int, grace_ms: int = 0) -> "JoinWindows":
        d = _ms("JoinWindows difference_ms", difference_ms)
        return cls(d, d, grace_ms)

    @property
    def size_ms(self) -> int:
        return self.before_ms + self.after_ms

    def describe(self) -> str:
        return f"join(-{self.before_ms}ms..+{self.after_ms}ms, grace {self.grace_ms}ms)"


@dataclass(frozen=True)
class SessionWindows:
    """Session windows: a key's records closer than `gap_ms` to each other form one session
    [first, last]; a record that bridges two sessions merges them; a session closes (late records
    are dropped) once stream time passes end + gap + grace (Kafka Streams' SessionWindows)."""

    gap_ms: int
    grace_ms: int = 0

    def __post_init__(self) -> None:
        _ms("session inactivity gap_ms", self.gap_ms, 1)
        _ms("session grace_ms", self.grace_ms, hint=GRACE_HINT)

    def describe(self) -> str:
        return f"session(gap {self.gap_ms}ms)"


@dataclass(frozen=True)
class SlidingWindows:
    """Sliding windows: windows [t - difference, t] of a fixed length that move with the records,
    one per distinct record position, as Kafka Streams' SlidingWindows (records at most
    `difference_ms` apart share a window); `grace_ms` as for time windows."""

    difference_ms: int
    grace_ms: int = 0

    def __post_init__(self) -> None:
        _ms("sliding windows difference_ms", self.difference_ms)
        _ms("sliding windows grace_ms", self.grace_ms, hint=GRACE_HINT)

    def end(self, start: int) -> int:
        return start + self.difference_ms

    def describe(self) -> str:
        return f"sliding({self.difference_ms}ms)"


def session_windows(gap_ms: int, grace_ms: int = 0) -> SessionWindows:
    return SessionWindows(gap_ms, grace_ms)


def sliding_windows(difference_ms: int, grace_ms: int = 0) -> SlidingWindows:
    return SlidingWindows(difference_ms, grace_ms)


# suppression ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Suppressed:
    """What `KTable.suppress()` holds back. `window_close`: a windowed table's final result per
    window, emitted once stream time passes the window's end + grace (tombstones are dropped);
    `time_limit`: the latest value per key, emitted `time_limit_ms` of stream time after the key's
    first buffered update. `max_records`: the buffer's size limit (None: unbounded); when full, a
    time-limit buffer emits its oldest entries early and a window-close buffer fails the task."""

    kind: str
    time_limit_ms: int = 0
    max_records: Optional[int] = None

    def describe(self) -> str:
        if self.kind == "window_close":
            return "until window closes"
        return f"until time limit {self.time_limit_ms}ms"


def until_window_closes(max_records: Optional[int] = None) -> Suppressed:
    if max_records is not None:
        _ms("until_window_closes max_records", max_records, 1)
    return Suppressed("window_close", 0, max_records)


def until_time_limit(time_limit_ms: int, max_records: Optional[int] = None) -> Suppressed:
    t = _ms("until_time_limit time_limit_ms", time_limit_ms)
    if max_records is not None:
        _ms("until_time_limit max_records", max_records, 1)
    return Suppressed("time_limit", t, max_records)



def tumbling(size_ms: int) -> TimeWindows:
    size_ms = int(size_ms)
    if size_ms <= 0:
        raise TopologyError(f"tumbling window size must be > 0 ms, got {size_ms}")
    return TimeWindows(size_ms, size_ms)


def hopping(size_ms: int, advance_ms: int) -> TimeWindows:
    size_ms, advance_ms = int(size_ms), int(advance_ms)
    if size_ms <= 0 or advance_ms <= 0 or advance_ms > size_ms:
        raise TopologyError(f"hopping windows need 0 < advance_ms <= size_ms, got size_ms={size_ms} "
                            f"advance_ms={advance_ms}")
    return TimeWindows(size_ms, advance_ms)


def serde_label(serde: Any) -> str:
    if isinstance(serde, str):
        return serde
    return getattr(serde, "name", None) or type(serde).__name__


def same_serde(a: Any, b: Any) -> bool:
    """Do two serdes give the same bytes for the same key (by name, or equal objects)?"""
    if serde_label(a) != serde_label(b):
        return False
    return isinstance(a, str) or isinstance(b, str) or a == b


def resolve_serde(serde: Any):
    from statekit.stores import get_serde

    return get_serde(serde)


Callable_ = Callable  # re-export for type hints elsewhere
