"""The machine's load as a restore would meet it, sampled for a while after each question.

A restore forecast (``state.forecast.rate_now``) divides a calibration's records per CPU-second by
the load: how many wall seconds a CPU-second of computing takes now. A sample is that figure for a
short spin (``SLICE_CPU_S`` of CPU time) by a process in a session of its own, every
``EVERY_S``; the load is the mean of the samples of the last ``WINDOW_S``.

- A session of its own: Linux shares the CPU between sessions first (autogroup). Inside the
  instance's session, a probe counted the notebook's own Spark micro-batches and dashboard
  (alone on the machine, 5.1 while the notebook produced; in ``make demo``, 8.6 before a restore
  that ran at 2.6), which a restore does not have beside it.
- A mean over seconds, not one moment: beside two other notebooks the load swings threefold within
  seconds, and a restore lasts long enough to see the average. Over four ``make demo`` runs, the
  mean of 10 s of such samples set against the restore that followed held within 1.2x; one 0.4 s
  probe was off by 2.3x either way.
- For a while after each question (``SAMPLE_FOR_S``), not always: a notebook cell's forecast asks
  (``load``); a dashboard's only looks (``current``). In a workshop room, eight dashboards that
  kept their samplers going took 5 s of CPU from the room's start and 0.17 of a core at rest.

The sampler is this file run as a script (``python -I -S machine_load.py``): it imports nothing of
statekit, and it exits when its stdin closes, as it does when the process that started it dies.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Optional

SLICE_CPU_S = 0.02    # CPU seconds a sample computes
EVERY_S = 0.5         # a sample this often
WINDOW_S = 10.0       # the load: the mean of the samples of this long
MIN_SAMPLES = 5       # a first question waits for this many (about 2.5 s)
SAMPLE_FOR_S = 60.0   # the sampler runs this long after the last question
LOAD_MAX = 30.0


class LoadSampler:
    """Samples of the machine's load, taken by a process of its own while questions come."""

    def __init__(self):
        self._lock = threading.Lock()
        self._samples: deque = deque(maxlen=int(SAMPLE_FOR_S / EVERY_S) + 10)   # (monotonic, load)
        self._proc: Optional[subprocess.Popen] = None
        self._until = 0.0
        self._fresh = threading.Condition(self._lock)

    def load(self, wait_s: float = 0.0) -> Optional[float]:
        """The mean load of the last ``WINDOW_S`` (None: no sampler could say). A first question
        starts the sampler and waits for ``MIN_SAMPLES`` samples, or for as many as ``wait_s``
        seconds bring (up to a full window) when the caller can wait that long: a notebook cell's
        forecast, whose figure a learner sets against the restore."""
        self.start()
        want = max(MIN_SAMPLES, int(min(wait_s, WINDOW_S) / EVERY_S))
        deadline = time.monotonic() + max(wait_s, MIN_SAMPLES * EVERY_S) + 1.5
        with self._fresh:
            while True:
                now = time.monotonic()
                recent = [v for t, v in self._samples if t >= now - WINDOW_S]
                if len(recent) >= want or now >= deadline or self._proc is None:
                    break
                self._fresh.wait(deadline - now)
        return sum(recent) / len(recent) if recent else None

    def current(self) -> Optional[float]:
        """The mean load of the last ``WINDOW_S`` if the sampler runs now (None otherwise): a look
        that starts nothing and keeps nothing running (a dashboard's forecasts, every few seconds
        while an app commits, would otherwise keep a sampler busy for good)."""
        with self._lock:
            if self._proc is None:
                return None
            now = time.monotonic()
            recent = [v for t, v in self._samples if t >= now - WINDOW_S]
        enough = min(MIN_SAMPLES, int(WINDOW_S / EVERY_S))
        return sum(recent) / len(recent) if recent and len(recent) >= enough else None

    def start(self) -> None:
        """Sample from now on, until ``SAMPLE_FOR_S`` after the last question."""
        with self._lock:
            self._until = time.monotonic() + SAMPLE_FOR_S
            if self._proc is not None and self._proc.poll() is None:
                return
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", os.path.abspath(__file__)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                    text=True, start_new_session=True)
            except OSError:
                self._proc = None
                return
            proc = self._proc
        threading.Thread(target=self._read, args=(proc,), daemon=True,
                         name="statekit-machine-load").start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            try:
                v = min(LOAD_MAX, max(1.0, float(line)))
            except ValueError:
                continue
            with self._fresh:
                self._samples.append((time.monotonic(), v))
                self._fresh.notify_all()
                over = time.monotonic() >= self._until
            if over:
                break
        self._end(proc)

    def _end(self, proc: subprocess.Popen) -> None:
        with self._lock:
            if self._proc is proc:
                self._proc = None
        try:
            proc.stdin.close()     # it reads EOF and exits
            proc.wait(timeout=5)
        except Exception:  # noqa: BLE001
            proc.kill()
        with self._fresh:
            self._fresh.notify_all()

    def stop(self) -> None:
        with self._lock:
            proc = self._proc
        if proc is not None:
            self._end(proc)

    def pid(self) -> Optional[int]:
        with self._lock:
            return self._proc.pid if self._proc is not None and self._proc.poll() is None else None


SAMPLER = LoadSampler()


def _sample_forever() -> None:
    import select

    while True:
        w0, c0 = time.perf_counter(), time.thread_time()
        x = 0
        while time.thread_time() - c0 < SLICE_CPU_S:
            for _ in range(200):
                x += 1
        cpu = time.thread_time() - c0
        print((time.perf_counter() - w0) / cpu, flush=True)
        ready, _, _ = select.select([sys.stdin], [], [], EVERY_S)
        if ready and not sys.stdin.readline():   # EOF: the asker is gone or done
            return


if __name__ == "__main__":
    try:
        _sample_forever()
    except (BrokenPipeError, KeyboardInterrupt):
        pass
