"""The per-record StoreReplay as it was before the run-based fast path: the reference model the
fast path is checked against (tests/state/test_state_fastpath.py). Kept verbatim apart from
its name and one rule added since, in both (offsets without records after a marker — a
transaction's control marker — move the safe offset); do not optimise it."""
from __future__ import annotations

from statekit.state.restore import (BATCH_HEADER, MARKER_KEY, NO_BATCH, _is_marker,
                                    _marker_batch, _record_batch)


class ReferenceReplay:
    """Replays one store's changelog with commit-marker semantics (used by restore and standby)."""

    def __init__(self, store: str, offset: int, batch: int = NO_BATCH):
        self.store = store
        self.position = offset          # next offset to read
        self.safe_offset = offset       # replaying from here is always safe
        self.group_start = offset       # right after the last marker read
        self.batch = batch              # latest committed batch seen (M)
        self.applied_batch = batch      # every commit up to this batch is applied (held excluded)
        self.pending: list = []         # (key, value, headers) since the last marker
        self.held: list = []            # committed records of batch M, not yet applied
        self.held_safe = offset         # safe offset to report while `held` is not applied
        self.records_read = 0
        self.records_applied = 0
        self.superseded = 0             # crashed-attempt records skipped at a seal's marker
        self.markers = 0

    def feed(self, records, next_offset: int | None = None) -> list:
        """Consume decoded records ``(offset, ts, key, value, headers)``; return the ``(key, value)``
        pairs that are committed and safe to apply now, in log order."""
        out: list = []
        pending = self.pending
        pend = pending.append
        mk = MARKER_KEY
        for rec in records:
            key = rec[2]
            if key == mk and _is_marker(key, rec[4]):
                self._commit(_marker_batch(rec[3], rec[4]), rec[0] + 1, out)
                pending = self.pending
                pend = pending.append
            else:
                pend(rec)
        self.records_read += len(records)
        if next_offset is not None:
            self.position = next_offset
            if not self.pending and next_offset > self.group_start:
                self.group_start = next_offset
                if not self.held:
                    self.safe_offset = self.held_safe = next_offset
        elif records:
            self.position = records[-1][0] + 1
        self.records_applied += len(out)
        return out

    def _commit(self, m: int, after: int, out: list) -> None:
        self.markers += 1
        group_start = self.group_start
        if m > self.batch:
            # a newer batch is committed here: the held records (batch M < m) are safe now
            if self.held:
                out.extend(self.held)
                self.held = []
            self.applied_batch = self.batch if self.batch > self.applied_batch else self.applied_batch
            self.batch = m
            self.held_safe = group_start
        held = self.held
        M = self.batch
        pending = self.pending
        # the common case: every record of the group carries exactly the header of batch M
        hm = ((BATCH_HEADER, str(M).encode()),)
        same = [(r[2], r[3]) for r in pending if r[4] == hm] if m == M else ()
        if len(same) == len(pending):
            held.extend(same)
        else:
            for rec in pending:
                b = _record_batch(rec[4])
                if b is not None and b > m:
                    self.superseded += 1
                    continue
                if b is None or b >= M:
                    held.append((rec[2], rec[3]))
                else:
                    out.append((rec[2], rec[3]))
        self.pending = []
        self.group_start = after
        if not held:
            self.applied_batch = M
            self.safe_offset = after
            self.held_safe = after
        else:
            self.safe_offset = self.held_safe

    def release_held(self, out: list | None = None) -> list:
        """Every store agrees the latest batch is committed: apply the held records."""
        out = [] if out is None else out
        if self.held:
            out.extend(self.held)
            self.records_applied += len(self.held)
            self.held = []
        self.applied_batch = self.batch
        self.safe_offset = self.group_start
        self.held_safe = self.group_start
        return out

    def drop_held(self) -> int:
        """Another store did not commit the latest batch: forget it here too (Spark replays it)."""
        n = len(self.held)
        self.held = []
        self.batch = self.applied_batch
        return n

    def meta(self) -> dict:
        return {"offset": self.safe_offset, "batch": self.applied_batch}


