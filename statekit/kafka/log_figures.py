"""How many records a partition holds: the figure a restore forecast needs and Kafka has no API for.

A compacted changelog holds fewer records than its offset span, and only the broker knows how
many. statekit's embedded broker writes its per-partition figures to a file every second
(``statekit.broker.log_stats``); this module is the one place above the broker that reads them,
behind a function the forecast is given (``LogFigures``), so the task-state layer never reads
broker files and any other Kafka simply has no figures (None: the forecast counts or bounds).
"""
from __future__ import annotations

from typing import Callable, Iterable, Optional

#: ``figures(topics, partition) -> {topic: {"records": int, "high_watermark": int, ...}}`` for the
#: topics it knows (a topic it has no figures for is absent).
LogFigures = Callable[[Iterable[str], int], dict]


def embedded_log_figures(broker_dir: str) -> LogFigures:
    """The figures of the embedded broker whose data directory is ``broker_dir``."""
    from statekit.broker import log_stats

    def figures(topics: Iterable[str], partition: int) -> dict:
        want = set(topics)
        try:
            rows = log_stats(broker_dir)
        except Exception:  # noqa: BLE001 - no figures: the caller falls back to offsets
            return {}
        return {r["topic"]: r for r in rows if r["topic"] in want and r["partition"] == partition}

    return figures


def log_figures_for(bootstrap: str) -> Optional[LogFigures]:
    """The figures of the default embedded broker when it is the one serving ``bootstrap``;
    None for any other Kafka."""
    from statekit.broker import default_dir, status

    info = status(None)
    if info is not None and info.get("bootstrap") == bootstrap:
        return embedded_log_figures(default_dir())
    return None
