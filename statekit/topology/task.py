"""The task half of a plan: `TaskProcessor`, what a host (the task runner, the test driver, the
Spark-native engine) runs for one task and one micro-batch.

Host protocol, per micro-batch::

    proc = plan.new_processor(ctx)          # ctx: task_id, batch_id, get_store(name),
                                            #      forward(topic, key, value, timestamp),
                                            #      forward_columns(topic, keys, values, timestamps),
                                            #      stream_time, cache_bytes, meta (persisted)
    n = proc.process_batch(records)         # a `Records`; stream-time punctuators fire in here
    proc.punctuate_wall_clock(now_ms)       # wall-clock punctuators, once per batch
    proc.flush()                            # cached aggregations forward (once per key)
    proc.close()
    # persist proc.stream_time and ctx.meta with the commit; proc.dropped_late, proc.skipped_null

The operators themselves live in `statekit.topology.ops`; this module builds them, feeds them the
records, holds back what cached aggregations forward until flush(), and runs punctuators.
"""
from __future__ import annotations

from typing import Any, Optional

from statekit.errors import ProcessorError, StatekitError
from statekit.topology import graph as g
from statekit.topology.graph import Node
from statekit.topology.held import HeldKey, held_key
from statekit.topology.processor import ProcessorContext
from statekit.topology.steps import _fail, _fanout, _Rec, _stateless, describe_step

_MEMO_MAX = 1 << 16
_MEMO_BYTES = 80             # only values this short are memoized (decoded once per batch)
_IMMUTABLE = (str, int, float, bool, bytes)


class TaskProcessor:
    """The task half of a plan, for one task and one batch. `process_batch(records)` runs a
    `Records` batch (bytes, decoded here with the source serdes, each record once);
    `process(route, key, value, timestamp, offset, partition)` one record of Python objects (an
    engine that decodes itself). `stream_time` is the highest timestamp seen (persist it).
    `flush()` at the end of the batch (before its commit) forwards what cached aggregations held
    back; `close()` flushes too, then closes the user processors.

    Forwarding rule of aggregations (count/reduce/aggregate, windowed, session, sliding or of a
    grouped table), as Kafka Streams' KTable record cache does:

    * caching on — the store was declared with `caching=True` (the default) *and* the task has a
      record cache (`context.cache_bytes > 0`; a context without `cache_bytes`, e.g. the Spark-native
      engine's, has none): an update is not forwarded when it happens; `flush()` forwards the latest
      value of every key updated in the batch, once per key (per (key, window) for windowed
      aggregations), in **first-update order** (the order in which keys were first updated in the
      batch), each with the metadata (timestamp, offset, partition, topic) of that key's last update;
      a key created and deleted within the batch (a session merged away) is not forwarded.
      With one commit per micro-batch that is one output per key per commit. Aggregations are flushed
      in topology order, so a cached aggregation downstream of another one sees its flushed updates
      and is flushed after it. Unlike Kafka Streams, an eviction from a full store cache does not
      forward early: outputs come only at flush.
    * caching off (`caching=False`, or `cache_bytes <= 0`): every update is forwarded at once.

    Table sources (`builder.table`) and joins forward every update either way.

    Bulk aggregation: with caching on, an aggregation fed straight by a source and whose store
    nothing else reads gets a batch's records at once, column-wise, per key
    (`statekit.topology.bulk`); what it stores and forwards is the same.
    `TaskProcessor.bulk_aggregation = False` turns it off (benches and tests compare).

    Time: `stream_time` is the task's (the highest record timestamp it has seen; time windows and
    stream-time punctuators use it). Joins, session and sliding windows and suppression keep their
    own observed stream time, as Kafka Streams' processors do, in `context.meta` (with punctuation
    schedules), which the host persists with the commit: a restarted task resumes exactly."""

    bulk_aggregation = True

    def __init__(self, plan, context) -> None:
        self.plan = plan
        self.context = context
        self.task_id = getattr(context, "task_id", None)
        self.batch_id = getattr(context, "batch_id", None)
        st = getattr(context, "stream_time", None)
        self.stream_time = -1 if st is None else int(st)
        cb = getattr(context, "cache_bytes", None)
        self.record_cache = cb is not None and cb > 0   # forward-on-flush for caching stores
        meta = getattr(context, "meta", None)
        self.meta: dict = meta if isinstance(meta, dict) else {}
        self.times: dict = self.meta.get("time") or {}   # per-operator observed stream time
        self.rec = _Rec()
        self.dropped_late = 0      # records dropped for windows that had closed
        self.skipped_null = 0      # records skipped for a None key/value before a keyed step
        self.records = 0
        self._stores: dict = {}
        self._processors: list = []
        self._entry = {}
        self._held: list = []      # (node index, node, {key: (new, first old, ts, off, part, topic)}, down, send_old)
        self._memo: dict = {}       # short value bytes -> decoded immutable value, per source serde
        self._getters: dict = {}
        self.punctuation = None    # statekit.topology.punctuation.Punctuation, on first schedule()
        self._next_stream_punct = float("inf")
        self._build()
        self._bulk = None        # {route: bulk.BulkAggregate}, the routes applied per key at once
        if self.bulk_aggregation and self.record_cache and not plan.engine_shuffle:
            from statekit.topology.bulk import bulk_routes

            self._bulk = bulk_routes(self) or None

    # -- stores and helpers the operators use ----------------------------------------------------
    def store(self, name: str):
        s = self._stores.get(name)
        if s is None:
            s = self._stores[name] = self.context.get_store(name)
        return s

    def holder(self, n: Node, down):
        """For an aggregation n: (emit(key, new, old), cached). Caching on (see the class
        docstring): emit remembers the latest value per key, the key's value before the batch and
        the record's metadata, for flush(); caching off: emit forwards (key, (new, old)) at once.
        Old values travel only where a later step needs them (`send_old`)."""
        send_old = n.params.get("send_old", False)
        if not (self.record_cache and n.stores[0].caching):
            if send_old:
                return (lambda k, new, old: down(k, (new, old))), False
            return (lambda k, new, old: down(k, (new, None))), False
        held: dict = {}
        idx = next(i for i, m in enumerate(self.plan.nodes) if m is n)
        self._held.append((idx, n, held, down, send_old))
        rec = self.rec

        def emit(k, new, old):
            hk = held_key(k)
            h = held.get(hk)
            held[hk] = (new, old if h is None else h[1], rec.timestamp, rec.offset, rec.partition,
                        rec.topic)
        return emit, True

    def held_of(self, n: Node) -> dict:
        """The held-back updates of a cached aggregation (its emit's dict, keyed by
        `held_key(key)`), for fast paths."""
        return next(h for _i, m, h, _d, _s in self._held if m is n)

    def forward_at(self, down, key, value, timestamp) -> None:
        """down(key, value) with the record's timestamp set to `timestamp` (a join's result time,
        a session's end, a suppressed record's own time) for the steps after."""
        rec = self.rec
        saved = rec.timestamp
        rec.timestamp = timestamp
        try:
            down(key, value)
        finally:
            rec.timestamp = saved

    def call(self, n: Node, k: Any, v: Any, fn, *args):
        """fn(*args) with a user function's failure turned into a one-line ProcessorError."""
        try:
            return fn(*args)
        except StatekitError:
            raise
        except Exception as e:
            raise _fail(n, self.rec, k, v, e) from e

    def getter(self, t: Node):
        """key -> current value of a (possibly derived) table, reading its store(s)."""
        get = self._getters.get(t.name)
        if get is None:
            from statekit.topology.ops import table_getter

            get = self._getters[t.name] = table_getter(self, t)
        return get

    # -- building --------------------------------------------------------------------------------
    def _build(self) -> None:
        plan = self.plan
        rec = self.rec
        built: dict = {}

        def build(n: Node):
            if n.name in built:
                return built[n.name]
            down = _fanout([build(c) for c in n.children])
            f = _stateless(n, down, rec)
            if f is None:
                f = self._stateful(n, down)
            built[n.name] = f
            return f

        for r in plan.routes:
            self._entry[r.index] = build(plan._by_name[r.target])
        self._held.sort(key=lambda h: h[0])   # flush upstream aggregations first
        self._topics = [s.topic for s in plan.sources]
        self._route_src = [r.source_index for r in plan.routes]
        self._route_topic = [self._topics[i] for i in self._route_src]
        for inst, ctx, n in self._processors:   # init user processors once everything exists
            init = getattr(inst, "init", None)
            if init is None:
                continue
            try:
                init(ctx)
            except StatekitError:
                raise
            except Exception as e:
                raise ProcessorError(f"{n.name} ({describe_step(n)}): init() failed in task "
                                     f"{self.task_id}: {type(e).__name__}: {e}") from e

    def _stateful(self, n: Node, down):
        kind = n.kind
        if kind == g.SINK:
            return self._sink(n)
        if kind == g.PROCESS:
            return self._process_node(n, down)
        from statekit.topology.ops import build

        return build(self, n, down)

    def _sink(self, n: Node):
        """A sink forwards (topic, key, value, the record's timestamp): a repartition record keeps
        its event time as its Kafka timestamp, as Kafka Streams writes it."""
        topic = n.params["topic"]
        fwd = self.context.forward
        rec = self.rec
        if not n.params.get("repartition"):
            return lambda k, v: fwd(topic, k, v, rec.timestamp)
        keep_null = n.params.get("keep_null_keys", False)
        tp = self

        def f(k, v):
            if k is None and not keep_null:
                tp.skipped_null += 1    # a None key cannot be partitioned for a keyed step
                return
            fwd(topic, k, v, rec.timestamp)
        return f

    def _process_node(self, n: Node, down):
        try:
            inst = n.fn()
        except Exception as e:
            raise ProcessorError(f"{n.name}: could not create processor {n.params['processor']}: "
                                 f"{type(e).__name__}: {e}") from e
        ctx = ProcessorContext(self, n.name, [s.name for s in n.stores], down)
        self._processors.append((inst, ctx, n))
        proc = inst.process
        rec = self.rec

        def f(k, v):
            try:
                proc(k, v)
            except StatekitError:
                raise
            except Exception as e:
                raise _fail(n, rec, k, v, e) from e
        return f

    # -- punctuation -----------------------------------------------------------------------------
    def schedule(self, node_name: str, interval_ms, punctuation_type, callback):
        """ProcessorContext.schedule(): see statekit.topology.processor."""
        if self.punctuation is None:
            from statekit.topology.punctuation import Punctuation

            self.punctuation = Punctuation(self)
        return self.punctuation.schedule(node_name, interval_ms, punctuation_type, callback)

    def wall_clock_ms(self) -> int:
        """The host's wall clock (the test driver's mock time), else time.time()."""
        wc = getattr(self.context, "wall_clock_ms", None)
        if callable(wc):
            wc = wc()
        if wc is None:
            import time

            return int(time.time() * 1000)
        return int(wc)

    def punctuate_wall_clock(self, now_ms: int) -> int:
        """Fire the wall-clock punctuators due at `now_ms` (once per batch, after its records);
        returns how many fired."""
        if self.punctuation is None:
            return 0
        return self.punctuation.fire_wall(int(now_ms))

    # -- flush -----------------------------------------------------------------------------------
    def flush(self) -> int:
        """Forward what cached aggregations held back (see the class docstring); returns how many
        records were forwarded. Call it once the batch's records are processed, before the outputs
        are read and committed."""
        if not self._held:
            return 0
        rec = self.rec
        saved = (rec.topic, rec.partition, rec.offset, rec.timestamp)
        bulk_of = {b.n.name: b for b in (self._bulk or {}).values()}
        n = 0
        try:
            for _i, node, held, down, send_old in self._held:
                b = bulk_of.get(node.name)
                if b is not None:
                    n += b.forward(down, send_old)
                if not held:
                    continue
                items = list(held.items())
                held.clear()
                for k, (new, old, ts, off, part, topic) in items:
                    if new is None and old is None:
                        continue   # created and deleted within the batch: nothing to tell
                    if type(k) is HeldKey:
                        k = k.key
                    n += 1
                    rec.topic, rec.partition, rec.offset, rec.timestamp = topic, part, off, ts
                    down(k, (new, old if send_old else None))
        finally:
            rec.topic, rec.partition, rec.offset, rec.timestamp = saved
        return n

    # -- running ---------------------------------------------------------------------------------
    def process(self, route: int, key: Any, value: Any, timestamp: int, offset: int,
                partition: Optional[int] = None) -> None:
        """One record of Python objects (an engine that decoded it): the per-record path."""
        rec = self.rec
        rec.topic = self._route_topic[route]
        rec.partition = partition
        rec.offset = offset
        rec.timestamp = timestamp
        if timestamp is not None and timestamp > self.stream_time:
            self.stream_time = timestamp
        self.records += 1
        self._entry[route](key, value)
        if self.stream_time >= self._next_stream_punct:
            self.punctuation.fire_stream(self.stream_time)

    def _decoder(self, si: int, which: int):
        """bytes -> object with source si's key (0) or value (1) serde, memoizing short immutable
        results for the batch (words and ids repeat; a dict is never shared between records)."""
        dec = self.plan.source_serdes(si)[which].from_bytes
        memo = self._memo.setdefault((si, which), {})

        def decode(b):
            if b is None:
                return None
            v = memo.get(b, memo)
            if v is not memo:
                return v
            v = dec(b)
            if len(b) <= _MEMO_BYTES and type(v) in _IMMUTABLE and len(memo) < _MEMO_MAX:
                memo[b] = v
            return v
        return decode

    def values_kept(self) -> dict:
        """``{source index: first bytes}``: the sources whose values only a bulk count sees. It
        needs to know which are null, so of a JSON source's values it needs those that can be the
        document ``null`` (they begin with whitespace or ``n``), of any other source's none."""
        from statekit.topology.bulk import JSON_NULL_FIRST

        out = {}
        for si, b in (self._bulk or {}).items():
            if b.op == "count":
                out[si] = b"" if b.null_value is None else JSON_NULL_FIRST
        return out

    def process_batch(self, records) -> int:
        """Run a `Records` batch (see `statekit.topology.records`) through the task's steps.

        The records of a source that leads straight into a bulk aggregation are applied column-wise
        after the others (nothing in the batch can see that aggregation's values before flush);
        every other record is decoded once with its source's serdes and runs step by step, with
        stream-time punctuators firing after the record that reaches them. Calling it twice with
        the two halves of a batch is the same as calling it once with the whole (a crash "after N
        records" cuts a batch so). Returns the number of records."""
        n = len(records)
        if not n:
            return 0
        bulk = self._bulk
        src = records.source
        if bulk is not None and src is not None and src in bulk \
                and self._next_stream_punct == float("inf"):
            top = max(records.timestamps)
            if top > self.stream_time:
                self.stream_time = top
            bulk[src].apply(records, None)
            self.records += n
            return n
        rec = self.rec
        entry = self._entry
        topics = self._route_topic
        decoders: dict = {}
        later: dict = {}
        st = self.stream_time
        try:
            for i, (si, p, o, ts, kb, vb) in enumerate(records.rows()):
                if ts is not None and ts > st:
                    st = self.stream_time = ts
                if bulk is not None and si in bulk:
                    later.setdefault(si, []).append(i)
                    if st >= self._next_stream_punct:
                        self.punctuation.fire_stream(st)
                    continue
                d = decoders.get(si)
                if d is None:
                    d = decoders[si] = (self._decoder(si, 0), self._decoder(si, 1))
                try:
                    k = d[0](kb)
                    v = d[1](vb)
                except Exception as e:
                    raise self._undecodable(si, p, o, kb, vb, e) from e
                rec.topic = topics[si]
                rec.partition = p
                rec.offset = o
                rec.timestamp = ts
                entry[si](k, v)
                if st >= self._next_stream_punct:
                    self.punctuation.fire_stream(st)
            for si, idx in later.items():
                bulk[si].apply(records, idx)
        finally:
            self.records += n
        return n

    def _undecodable(self, si: int, partition, offset, kb, vb, e) -> ProcessorError:
        from statekit.topology.graph import serde_label
        from statekit.topology.steps import _abbrev

        src = self.plan.sources[si]
        where = (f"cannot decode a record of {src.topic} partition {partition} offset {offset} "
                 f"with serdes {serde_label(src.key_serde)}/{serde_label(src.value_serde)}")
        if isinstance(e, StatekitError):    # a serde's own line says what it found and what to do
            return ProcessorError(f"{where}: {e}")
        return ProcessorError(
            f"{where}: {type(e).__name__}: {e} (key={_abbrev(kb)} value={_abbrev(vb)}); pass "
            f"key_serde=/value_serde= to stream()/table() to read it")

    def close(self) -> None:
        self.flush()
        if self.times:
            self.meta["time"] = self.times   # (the host persists the meta with the commit)
        errors = []
        for inst, _ctx, n in self._processors:
            close = getattr(inst, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as e:  # close every processor, report the first failure
                    errors.append(ProcessorError(f"{n.name}: close() failed: {type(e).__name__}: {e}"))
        self._processors = []
        if errors:
            raise errors[0]

