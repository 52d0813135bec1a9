"""The topology as a plain graph: nodes, store declarations, windows and a few serdes of its own.

Nothing here runs a record; `plan.py` compiles this graph into what engines run. Node names follow
Kafka Streams (`KSTREAM-MAP-0000000003`) so a `describe()` reads like `Topology#describe()`.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from statekit.errors import TopologyError

# node kinds -------------------------------------------------------------------------------------
SOURCE = "source"                 # a topic read (stream or table role)
TABLE_SOURCE = "table_source"     # materializes a table topic into its kv store
MAP = "map"
MAP_VALUES = "map_values"
FILTER = "filter"
FLAT_MAP = "flat_map"
FLAT_MAP_VALUES = "flat_map_values"
PEEK = "peek"
KEY_SELECT = "key_select"         # group_by(fn): the new key, before the shuffle
AGGREGATE = "aggregate"           # count / reduce / aggregate into a kv store
WINDOW_AGGREGATE = "window_aggregate"
JOIN = "join"                     # stream-table join (reads the table's store)
PROCESS = "process"               # processor API
TABLE_FILTER = "table_filter"
TABLE_MAP_VALUES = "table_map_values"
TO_STREAM = "to_stream"
SINK = "sink"

KS_NAMES = {
    SOURCE: "KSTREAM-SOURCE", TABLE_SOURCE: "KTABLE-SOURCE", MAP: "KSTREAM-MAP",
    MAP_VALUES: "KSTREAM-MAPVALUES", FILTER: "KSTREAM-FILTER", FLAT_MAP: "KSTREAM-FLATMAP",
    FLAT_MAP_VALUES: "KSTREAM-FLATMAPVALUES", PEEK: "KSTREAM-PEEK", KEY_SELECT: "KSTREAM-KEY-SELECT",
    AGGREGATE: "KSTREAM-AGGREGATE", WINDOW_AGGREGATE: "KSTREAM-WINDOWED-AGGREGATE",
    JOIN: "KSTREAM-JOIN", PROCESS: "KSTREAM-PROCESSOR", TABLE_FILTER: "KTABLE-FILTER",
    TABLE_MAP_VALUES: "KTABLE-MAPVALUES", TO_STREAM: "KTABLE-TOSTREAM", SINK: "KSTREAM-SINK",
}

# Steps that need their input partitioned by their key (they read or write a task's store).
KEY_DEPENDENT = {TABLE_SOURCE, AGGREGATE, WINDOW_AGGREGATE, JOIN}
# Steps whose output key may differ from their input key.
KEY_CHANGING = {MAP, FLAT_MAP, KEY_SELECT, PROCESS, WINDOW_AGGREGATE}

_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,180}$")


def check_name(what: str, name: Any) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise TopologyError(f"{what} {name!r} is not a valid name: use 1-180 characters among "
                            f"letters, digits, '.', '_' and '-' (it becomes part of a topic name)")
    return name


@dataclass
class Node:
    """One step of the topology. `parent` is the node whose records flow in (None for sources);
    `table` is the table a join reads (not a flow edge); `stores` the stores the step uses."""

    name: str
    kind: str
    parent: Optional["Node"] = None
    children: list = field(default_factory=list)
    fn: Any = None                       # the user function(s) of the step
    params: dict = field(default_factory=dict)
    stores: list = field(default_factory=list)   # store names
    table: Optional["Node"] = None       # JOIN: the table node whose store is read
    key_serde: Any = "str"               # serdes of the records this node emits
    value_serde: Any = "str"
    origin: str = ""                     # the source topic this lineage started from (naming)

    def __repr__(self) -> str:
        return f"Node({self.name})"


# store declarations ------------------------------------------------------------------------------

@dataclass
class StoreDecl:
    """A store the topology declares; becomes a `statekit.stores.StoreSpec` at compile().

    `name=None` means "name it for me" (resolved at compile, after every explicit name is known)."""

    name: Optional[str]
    kind: str = "kv"                     # "kv" | "window"
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


def store_spec(name: str, kind: str = "kv", **kw) -> StoreDecl:
    """Generic helper: `store_spec("x")`, `store_spec("w", kind="window", size_ms=60_000)`."""
    if kind == "kv":
        return kv_store(name, **kw)
    if kind == "window":
        return window_store(name, **kw)
    raise TopologyError(f"store {name!r}: kind must be 'kv' or 'window', got {kind!r}")


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


# serdes the topology adds ------------------------------------------------------------------------

class WindowedSerde:
    """Keys of windowed results, `(key, window_start)`: the inner key's bytes followed by the 8-byte
    big-endian window start — Kafka's TimeWindowedSerializer layout."""

    def __init__(self, inner: Any = "str") -> None:
        self.inner = inner
        self._inner = None
        self.name = f"windowed({inner if isinstance(inner, str) else type(inner).__name__})"

    def _s(self):
        if self._inner is None:
            from statekit.stores import get_serde

            self._inner = get_serde(self.inner)
        return self._inner

    def to_bytes(self, obj) -> bytes:
        key, start = obj
        return self._s().to_bytes(key) + struct.pack(">q", int(start))

    def from_bytes(self, data: bytes):
        return (self._s().from_bytes(data[:-8]), struct.unpack(">q", data[-8:])[0])

    def __getstate__(self):
        return {"inner": self.inner, "name": self.name}

    def __setstate__(self, st):
        self.inner, self.name, self._inner = st["inner"], st["name"], None

    def __eq__(self, other):
        return isinstance(other, WindowedSerde) and other.inner == self.inner

    def __hash__(self):
        return hash(("windowed", str(self.inner)))


def serde_label(serde: Any) -> str:
    if isinstance(serde, str):
        return serde
    return getattr(serde, "name", None) or type(serde).__name__


def resolve_serde(serde: Any):
    from statekit.stores import get_serde

    return get_serde(serde)


Callable_ = Callable  # re-export for type hints elsewhere
