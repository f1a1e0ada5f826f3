"""The sender: one daemon thread that turns what the training loop buffered into v1 batches and
delivers them.

The training thread only appends to deques (atomic in CPython, so no lock is shared with the hot
path). This thread drains them, converts values (a 0-d tensor becomes a float here, never in the
training loop), cuts batches of at most ``max_batch_rows`` rows and sends them oldest first.
A batch keeps its batch_id across retries, which is what lets the collector store it once however
often it arrives.
"""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer_plugin.protocol import (
    _METRIC_NAME,
    GPU_COLUMNS,
    MAX_EVENTS,
    MAX_METRICS,
    make_batch,
    row_count,
)
from trainer_plugin.spool import Spool, split_events
from trainer_plugin.transports import PermanentSendError, TransientSendError, Transport

log = logging.getLogger("runwatch")
_isfinite = math.isfinite

#: One buffered step: (step, ts, duration_s, tokens, metrics), exactly as the training loop gave
#: them; nothing is converted on the hot path.
StepRow = tuple[Any, float, Any, Any, dict[str, Any]]

#: While the collector is away, rows are batched (and so written to the spool) at least this often.
SPILL_EVERY_S = 10.0

#: Batch size while closing: small enough (~10 ms to convert) that the close deadline is kept.
CLOSING_BATCH_ROWS = 2000


class OnceLogger:
    """Logs each distinct problem once: a bad metric fed every step must not flood the training
    job's log with a line per step."""

    def __init__(self, logger: logging.Logger):
        self._logger = logger
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def _first(self, key: str) -> bool:
        with self._lock:
            if key in self._seen or len(self._seen) > 1000:
                return False
            self._seen.add(key)
            return True

    def warning(self, key: str, message: str, *args: Any, exc_info: bool = False) -> None:
        if self._first(key):
            self._logger.warning(message, *args, exc_info=exc_info)


once = OnceLogger(log)


def as_float(value: Any, name: str) -> float | None:
    """A finite float, or None for a missing, non-finite or unconvertible value."""
    cls = value.__class__
    if cls is float:  # the common case, without the cost of a call and a try
        return value if _isfinite(value) else None
    if value is None:
        return None
    try:
        number = float(value)  # a 0-d tensor converts here, in the sender thread
    except Exception:
        once.warning(f"float:{name}:{type(value).__name__}",
                     "Runwatch: dropping values of %r: cannot convert %s to a number",
                     name, type(value).__name__)
        return None
    # JSON has no NaN; a diverged loss travels as null and the collector stores NULL.
    return number if math.isfinite(number) else None


def as_count(value: Any, name: str) -> int | None:
    """A non-negative int, or None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = int(value)
    except Exception:
        once.warning(f"int:{name}:{type(value).__name__}",
                     "Runwatch: dropping values of %r: cannot convert %s to an integer",
                     name, type(value).__name__)
        return None
    return number if number >= 0 else None


def json_safe(value: Any, depth: int = 0) -> Any:
    """Event fields as JSON the collector accepts: finite numbers, strings, lists, objects."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth < 8 and isinstance(value, dict):
        return {str(key): json_safe(item, depth + 1) for key, item in value.items()}
    if depth < 8 and isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(item, depth + 1) for item in value]
    if hasattr(value, "__float__") and not hasattr(value, "__len__"):
        return as_float(value, "event field")
    return str(value)


class DeadlinePassed(Exception):
    """close() stopped waiting while a batch was being converted."""


def step_columns(rows: list[StepRow], give_up: Callable[[], bool] | None = None,
                 ) -> tuple[dict[str, Any], int]:
    """Builds the columnar ``steps`` table; returns it and the number of rows left out.

    Raises DeadlinePassed as soon as ``give_up()`` is true: a large batch takes a while, and once
    close() has returned the interpreter may be shutting down under this thread."""
    steps: list[int] = []
    ts: list[float] = []
    durations: list[float | None] = []
    tokens: list[int | None] = []
    metrics: dict[str, list[float | None]] = {}
    rejected_names: set[str] = set()
    skipped = 0
    for index, (step, when, duration_s, token_count, values) in enumerate(rows):
        if index % 500 == 0 and give_up is not None and give_up():
            raise DeadlinePassed
        step_number = as_count(step, "step")
        if step_number is None:
            once.warning(f"step:{type(step).__name__}",
                         "Runwatch: dropping a step whose number is %r; step numbers must be "
                         "integers >= 0", step)
            skipped += 1
            continue
        n = len(steps)
        steps.append(step_number)
        ts.append(when)
        durations.append(as_float(duration_s, "duration_s"))
        tokens.append(as_count(token_count, "tokens"))
        for name, value in values.items():
            column = metrics.get(name)
            if column is None:
                if name in rejected_names:
                    continue
                if not _METRIC_NAME.match(name) or len(metrics) >= MAX_METRICS:
                    rejected_names.add(name)
                    once.warning(f"metric:{name}",
                                 "Runwatch: dropping metric %r: names must be identifiers of at "
                                 "most 64 characters and a run may log at most %d metrics",
                                 name, MAX_METRICS)
                    continue
                column = metrics[name] = [None] * n
            column.append(as_float(value, name))
        # Metrics absent from this step are null in this row, so all columns stay equally long.
        for column in metrics.values():
            if len(column) == n:
                column.append(None)
    table = {"step": steps, "ts": ts, "duration_s": durations, "tokens": tokens,
             "metrics": metrics}
    return table, skipped


def gpu_columns(rows: list[tuple]) -> dict[str, Any]:
    """The columnar ``gpus`` table from the sampler's tuples
    ``(ts, gpu, temp_c, power_w, util_pct, mem_used_mb, sm_clock_mhz, throttle)``."""
    table: dict[str, Any] = {column: [] for column in GPU_COLUMNS}
    for row in rows:
        try:
            ts, gpu, temp, power, util, mem, clock, throttle = row
        except (TypeError, ValueError):
            once.warning("gpu-row", "Runwatch: dropping a malformed GPU sample %r", row)
            continue
        when, index = as_float(ts, "gpus.ts"), as_count(gpu, "gpus.gpu")
        if when is None or when < 0 or index is None:
            continue
        table["ts"].append(when)
        table["gpu"].append(index)
        table["temp_c"].append(as_float(temp, "temp_c"))
        table["power_w"].append(as_float(power, "power_w"))
        table["util_pct"].append(as_float(util, "util_pct"))
        table["mem_used_mb"].append(as_float(mem, "mem_used_mb"))
        table["sm_clock_mhz"].append(as_float(clock, "sm_clock_mhz"))
        table["throttle"].append(as_count(throttle, "throttle"))
    return table


def path_bytes(path: Any) -> int | None:
    """Bytes under ``path``: a file's size, or the sum of the files in a directory tree (links
    not followed). None when it does not exist."""
    try:
        root = os.fspath(path)
        if not os.path.isdir(root):
            return os.stat(root).st_size
        total = 0
        for directory, _subdirs, files in os.walk(root):
            for name in files:
                try:
                    total += os.lstat(os.path.join(directory, name)).st_size
                except OSError:
                    pass
        return total
    except (OSError, TypeError, ValueError):
        return None


def split_in_halves(batch: dict[str, Any]) -> list[dict[str, Any]]:
    """A batch the collector found too large (413) as two, each with about half of every table.
    New batch ids: the collector stored none of the original."""
    steps, gpus, events = batch["steps"], batch["gpus"], batch["events"]
    halves = []
    n_steps, n_gpus, n_events = len(steps["step"]), len(gpus["ts"]), len(events)
    for first in (True, False):
        def cut(column: list, n: int, first: bool = first) -> list:
            return column[: (n + 1) // 2] if first else column[(n + 1) // 2:]

        half_steps = {name: cut(steps[name], n_steps) for name in ("step", "ts", "duration_s", "tokens")}
        half_steps["metrics"] = {name: cut(values, n_steps) for name, values in steps["metrics"].items()}
        half_gpus: dict[str, Any] = {name: cut(gpus[name], n_gpus) for name in GPU_COLUMNS}
        if "simulated" in gpus:
            half_gpus["simulated"] = gpus["simulated"]
        halves.append(make_batch(run=batch["run"], source=batch["source"], steps=half_steps,
                                 gpus=half_gpus, events=cut(events, n_events)))
    return [half for half in halves if row_count(half)]


def _take(buffer: deque, limit: int) -> list[Any]:
    taken = []
    popleft = buffer.popleft
    for _ in range(min(limit, len(buffer))):
        taken.append(popleft())
    return taken


@dataclass(eq=False)
class PendingBatch:
    batch: dict[str, Any]
    rows: int
    created_ns: int = 0
    attempts: int = 0
    spool_name: str | None = None  # set when this batch is the spool's oldest file, being replayed


class Sender:
    """Delivery, in order, at least once. Where a batch lives:

    1. the monitor's deques (rows as the training loop gave them), bounded by ``buffer_rows``;
    2. ``_pending``: converted batches in memory, at most ``memory_batches`` of them;
    3. the spool on disk, from the first failed send until it is empty again.

    Batches are sent oldest first: memory, then the spool's files in name order. While the spool
    holds anything, new batches go behind it on disk, so order holds across an outage and across
    processes; memory stays bounded however long the outage lasts.
    """

    def __init__(
        self,
        *,
        transport: Transport | None,
        steps: deque,
        events: deque,
        wake: threading.Event,
        run: dict[str, Any],
        source: dict[str, Any],
        gpus: deque | None = None,
        gpu_simulated: Callable[[], bool] | None = None,
        spool: Spool | None = None,
        flush_interval_s: float = 1.0,
        max_batch_rows: int = 5000,
        max_pending_rows: int = 200_000,
        memory_batches: int = 4,
        heartbeat_interval_s: float | None = 5.0,
        progress: Callable[[], Any] | None = None,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        retry_after_max_s: float = 300.0,
    ):
        self._transport = transport  # None: offline, everything goes to the spool
        self._steps = steps
        self._events = events
        self._gpus: deque = gpus if gpus is not None else deque()
        self._gpu_simulated = gpu_simulated or (lambda: False)
        self._wake = wake
        self._run = run
        self._source = source
        self._spool = spool
        self._flush_interval_s = max(0.001, flush_interval_s)
        self._max_batch_rows = max(1, max_batch_rows)
        self._max_pending_rows = max(self._max_batch_rows, max_pending_rows)
        self._memory_batches = max(1, memory_batches)
        self._heartbeat_interval_s = heartbeat_interval_s if heartbeat_interval_s and \
            heartbeat_interval_s > 0 else None
        self._progress = progress
        self._backoff_base_s = backoff_base_s
        self._backoff_max_s = max(backoff_base_s, backoff_max_s)
        self._retry_after_max_s = retry_after_max_s

        self._pending: deque[PendingBatch] = deque()
        self._pending_rows = 0
        self._spool_head: PendingBatch | None = None
        self._next_attempt_at = 0.0  # time.monotonic() before which no send is tried
        self._failures = 0  # consecutive transient failures
        self._next_heartbeat = time.monotonic() + (self._heartbeat_interval_s or math.inf)
        self._stopping = threading.Event()
        self._deadline = math.inf
        self._abandoned_at_close = 0
        self._flush_lock = threading.Lock()
        self._flush_requests: list[tuple[threading.Event, float]] = []
        self._last_ns = 0
        self._last_batched = time.monotonic()
        self._thread = threading.Thread(target=self._main, name="runwatch-sender", daemon=True)

        self.steps_drained = 0
        self.batches_sent = 0
        self.rows_sent = 0
        self.batches_dropped = 0
        self.rows_dropped = 0
        self.send_errors = 0
        self.heartbeats = 0

    # --- called from the monitor --------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    @property
    def rows_spooled(self) -> int:
        """Rows this process wrote to the spool (some may have been replayed since)."""
        return self._spool.rows_written if self._spool is not None else 0

    def flush(self, timeout_s: float) -> bool:
        """From any other thread: converts everything buffered and sends it, or writes it to the
        spool when sending fails or is backing off. Returns True when it was done within
        ``timeout_s`` (delivered or on disk)."""
        if not self._thread.is_alive() or threading.current_thread() is self._thread:
            return False
        done = threading.Event()
        with self._flush_lock:
            self._flush_requests.append((done, time.monotonic() + max(0.0, timeout_s)))
        self._wake.set()
        return done.wait(max(0.0, timeout_s))

    def stop(self, timeout_s: float) -> bool:
        """Sends everything still buffered, trying until ``timeout_s`` has passed, then stops.
        Returns True when all of it was delivered (what went to the spool was not, yet)."""
        timeout_s = max(0.0, timeout_s)
        # The thread's own deadline comes a little earlier than the join's, so that it has
        # finished its last conversion or send, and is idle, when close() returns.
        self._deadline = time.monotonic() + timeout_s - min(0.25, timeout_s * 0.1)
        self._stopping.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(max(0.0, timeout_s))
        if self._thread.is_alive():
            log.warning("Runwatch: could not deliver all metrics within %.1f s; %d batches were "
                        "not delivered", timeout_s, len(self._pending))
            return False
        left_on_disk = len(self._spool) if self._spool is not None else 0
        if left_on_disk:
            log.warning("Runwatch: %d batches are kept in the spool %s; the next process of this "
                        "run sends them, or run `runwatch sync %s`", left_on_disk,
                        self._spool.directory, self._spool.directory)  # type: ignore[union-attr]
        return (not self._abandoned_at_close and not self._steps and not self._events
                and not self._pending and not left_on_disk)

    # --- the thread ---------------------------------------------------------------------------

    def _main(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self._wait_s())
            self._wake.clear()
            if self._stopping.is_set():
                break
            self._guarded(self._cycle)
        self._guarded(self._final_flush)
        self._answer_flushes(force=True)
        try:
            if self._transport is not None:
                self._transport.close()
        except Exception:
            log.debug("Runwatch: closing the transport failed", exc_info=True)

    def _guarded(self, work: Any) -> None:
        # A bug here must cost metrics, never the thread: a dead sender would let the buffer fill
        # silently for the rest of the run.
        try:
            work()
        except Exception:
            once.warning("sender-bug", "Runwatch: unexpected error in the sender thread",
                         exc_info=True)

    def _has_backlog(self) -> bool:
        return bool(self._pending) or self._spool_head is not None or \
            (self._spool is not None and len(self._spool) > 0)

    def _wait_s(self) -> float:
        now = time.monotonic()
        wait = min(self._flush_interval_s, self._next_heartbeat - now)
        if self._has_backlog() and self._transport is not None:
            wait = min(wait, self._next_attempt_at - now)
        return max(0.001, wait)

    def _past_deadline(self) -> bool:
        return time.monotonic() >= self._deadline

    def _backing_off(self) -> bool:
        return self._transport is None or (self._has_backlog()
                                           and time.monotonic() < self._next_attempt_at)

    def _heartbeat(self) -> None:
        now = time.monotonic()
        if now < self._next_heartbeat:
            return
        self._next_heartbeat = now + (self._heartbeat_interval_s or math.inf)
        fields: dict[str, Any] = {"kind": "heartbeat", "ts": time.time()}
        if self._progress is not None:
            fields["step"] = self._progress()
        self._events.append(fields)
        self.heartbeats += 1

    def _cycle(self) -> None:
        self._heartbeat()
        if self._flush_requests:
            self._flush_now()
            return
        # While backing off, rows stay in the buffer until they fill a whole batch or have waited
        # SPILL_EVERY_S: an outage writes a file every few seconds, not every flush interval,
        # and a process killed during it loses at most those seconds of rows.
        now = time.monotonic()
        full_only = self._backing_off() and now - self._last_batched < SPILL_EVERY_S
        if not full_only:
            self._last_batched = now
        self._batch_up(full_only=full_only)
        self._send_pending(deadline=math.inf)

    def _flush_now(self) -> None:
        with self._flush_lock:
            requests, self._flush_requests = self._flush_requests, []
        deadline = max(when for _done, when in requests)
        self._batch_up(full_only=False)
        # Durable first (the process may be about to die), then delivered if the collector is
        # there: the spool is sent oldest first, so order is kept. Whole batches: as few requests
        # as possible in the little time a signal handler waits.
        self._spill_all("flush", split=False)
        if time.monotonic() >= self._next_attempt_at:
            self._send_pending(deadline=deadline)
        for done, _when in requests:
            done.set()

    def spool_copies(self) -> int:
        """From another thread whose process is about to end while this thread is stuck (a send
        hanging on a dead collector): writes a copy of every converted batch still in memory to
        the spool, whole, ids kept, so a copy of a batch that does get through is stored once.
        Returns how many were written."""
        spool = self._spool
        if spool is None:
            return 0
        for _ in range(3):
            try:
                items = list(self._pending)
                break
            except RuntimeError:  # changed while copying; try again
                continue
        else:
            return 0
        written = 0
        for item in items:
            if item.spool_name is not None:
                continue  # already on disk
            # From now on this batch keeps its id wherever it goes: never split, never re-made.
            item.attempts = max(item.attempts, 1)
            if spool.write(item.batch, created_ns=item.created_ns, part=9) is not None:
                written += 1
        return written

    def _answer_flushes(self, force: bool) -> None:
        with self._flush_lock:
            requests, self._flush_requests = self._flush_requests, []
        for done, _when in requests:
            done.set()

    def _final_flush(self) -> None:
        if self._failures or self._transport is None:
            # The collector was away: first make everything durable, then use what is left of
            # the timeout to deliver from the spool.
            while (self._steps or self._events or self._gpus) and not self._past_deadline():
                self._batch_up(full_only=False, max_batches=1, batch_rows=CLOSING_BATCH_ROWS)
                self._spill_all("closing while the collector is away")
            self._spill_all("closing while the collector is away")
            # The process is ending: one immediate try is worth more than the rest of a backoff.
            self._next_attempt_at = time.monotonic()
        while self._transport is not None:
            # One batch at a time, so that the deadline is checked between conversions and a
            # full buffer cannot keep this thread busy past close().
            self._batch_up(full_only=False, max_batches=1, batch_rows=CLOSING_BATCH_ROWS)
            if not (self._has_backlog() or self._steps or self._events or self._gpus):
                return
            now = time.monotonic()
            if now >= self._deadline or self._next_attempt_at >= self._deadline:
                break
            if now < self._next_attempt_at:
                time.sleep(self._next_attempt_at - now)
                continue
            self._send_pending(deadline=self._deadline)
        self._spill_all("not delivered before close")
        while self._pending:
            self._abandoned_at_close += 1
            self._drop(self._pending.popleft(), "not delivered before close")
        # Rows never even converted: counted, not sent.
        steps, events, gpus = len(self._steps), len(self._events), len(self._gpus)
        self._steps.clear()
        self._events.clear()
        self._gpus.clear()
        self.steps_drained += steps
        self.rows_dropped += steps + events + gpus
        self._abandoned_at_close += bool(steps or events or gpus)

    # --- batching -----------------------------------------------------------------------------

    def _next_ns(self) -> int:
        self._last_ns = max(time.time_ns(), self._last_ns + 1)
        return self._last_ns

    def _batch_up(self, *, full_only: bool, max_batches: float = math.inf,
                  batch_rows: int | None = None) -> None:
        limit = min(self._max_batch_rows, batch_rows or self._max_batch_rows)
        made = 0
        while (self._events or self._steps or self._gpus) and made < max_batches:
            if time.monotonic() >= self._deadline:
                return  # close() has given up waiting; _final_flush counts what is left
            made += 1
            if full_only and len(self._steps) + len(self._events) + len(self._gpus) < limit:
                return
            events = _take(self._events, min(limit, MAX_EVENTS))
            gpu_rows = _take(self._gpus, (limit - len(events)) // 2 if self._steps else
                             limit - len(events))
            rows = _take(self._steps, limit - len(events) - len(gpu_rows))
            self.steps_drained += len(rows)
            try:
                table, skipped = step_columns(rows, self._past_deadline)
            except DeadlinePassed:
                self.rows_dropped += len(rows) + len(events) + len(gpu_rows)
                self._abandoned_at_close += 1
                return
            self.rows_dropped += skipped
            gpus = gpu_columns(gpu_rows)
            gpus["simulated"] = bool(self._gpu_simulated())
            self.rows_dropped += len(gpu_rows) - len(gpus["ts"])
            batch = make_batch(run=self._run, source=self._source, steps=table, gpus=gpus,
                               events=[self._event_fields(event) for event in events])
            self._enqueue(PendingBatch(batch, row_count(batch), self._next_ns()))

    @staticmethod
    def _event_fields(event: dict[str, Any]) -> Any:
        measure = event.pop("_measure_path", None)
        if measure is not None:
            # A checkpoint's size, measured here rather than on the training thread: a sharded
            # checkpoint directory can hold thousands of files.
            event["bytes"] = path_bytes(measure)
        return json_safe(event)

    def _enqueue(self, item: PendingBatch) -> None:
        if self._spool is not None and (self._transport is None or len(self._spool) > 0
                                        or self._spool_head is not None
                                        or len(self._pending) >= self._memory_batches):
            self._spill(item, "behind the spool")
            return
        self._pending.append(item)
        self._pending_rows += item.rows
        while self._pending_rows > self._max_pending_rows and len(self._pending) > 1:
            self._drop(self._pending.popleft(), "too much undelivered data")

    def _spill_all(self, why: str, split: bool = True) -> None:
        if self._spool is None:
            return  # no disk: batches wait in memory, bounded by max_pending_rows
        while self._pending:
            item = self._pending.popleft()
            self._pending_rows -= item.rows
            self._spill(item, why, split)

    def _spill(self, item: PendingBatch, why: str, split: bool = True) -> None:
        """Writes a batch to the spool (the caller has taken it off the pending list)."""
        spool = self._spool
        if spool is None:
            self._pending_rows += item.rows  # _drop takes it off again
            self._drop(item, why)
            return
        try:
            # A batch never sent may be split, so that its rows can be dropped for space without
            # its events; one that was sent keeps its id, which the collector may have stored.
            parts = split_events(item.batch) if split and item.attempts == 0 else [item.batch]
            for part, batch in enumerate(parts):
                if spool.write(batch, created_ns=item.created_ns, part=part) is None:
                    self.batches_dropped += 1
                    self.rows_dropped += row_count(batch)
        except Exception as error:
            once.warning(f"spool:{type(error).__name__}", "Runwatch: cannot write to the spool "
                         "%s (%s); dropping undelivered metrics", spool.directory, error)
            self.batches_dropped += 1
            self.rows_dropped += item.rows

    def _drop(self, item: PendingBatch, why: str) -> None:
        # The caller has already taken ``item`` off the pending list.
        self._pending_rows -= item.rows
        self._on_undeliverable(item.batch, item.rows, why)

    def _on_undeliverable(self, batch: dict[str, Any], rows: int, why: str) -> None:
        """A batch that will not be delivered: only without a usable spool, or at the close
        deadline. Counted and logged once per reason."""
        self.batches_dropped += 1
        self.rows_dropped += rows
        once.warning(f"undeliverable:{why}",
                     "Runwatch: dropping undelivered metrics (%s); stats['rows_dropped'] counts "
                     "them", why)

    # --- delivery -----------------------------------------------------------------------------

    def _next_to_send(self) -> PendingBatch | None:
        if self._pending:
            return self._pending[0]
        if self._spool_head is not None:
            return self._spool_head
        spool = self._spool
        while spool is not None and len(spool) > 0:
            name = spool.oldest()
            if name is None:
                return None
            batch = spool.load(name)
            if batch is None:
                continue
            # Treated as sent before: it may have been, so it keeps its id whatever happens.
            self._spool_head = PendingBatch(batch, row_count(batch), attempts=1, spool_name=name)
            return self._spool_head
        return None

    def _done_with(self, item: PendingBatch) -> None:
        if item.spool_name is not None:
            self._spool_head = None
            self._spool.remove(item.spool_name)  # type: ignore[union-attr]
        else:
            self._pending.popleft()
            self._pending_rows -= item.rows

    def _send_pending(self, deadline: float) -> None:
        if self._transport is None:
            return
        while True:
            now = time.monotonic()
            deadline = min(deadline, self._deadline)
            if now < self._next_attempt_at or now >= deadline:
                return
            item = self._next_to_send()
            if item is None:
                return
            item.attempts += 1
            try:
                self._transport.send(item.batch, timeout_s=deadline - now
                                     if deadline != math.inf else None)
            except PermanentSendError as error:
                self.send_errors += 1
                self._done_with(item)
                if error.status == 413 and item.rows > 1:
                    # Too large for this collector: the same rows in two smaller batches, in place.
                    for half in reversed(split_in_halves(item.batch)):
                        self._pending.appendleft(PendingBatch(half, row_count(half),
                                                              item.created_ns))
                        self._pending_rows += row_count(half)
                    log.info("Runwatch: the collector found a batch of %d rows too large; sending "
                             "it in halves", item.rows)
                    continue
                # Retrying a batch the collector refused would only refuse it again.
                once.warning(f"permanent:{error}", "Runwatch: the collector refused a batch of "
                             "%d rows, which is dropped: %s", item.rows, error)
                self.batches_dropped += 1
                self.rows_dropped += item.rows
                continue
            except TransientSendError as error:
                self._retry_later(error, error.retry_after)
                return
            except Exception as error:
                # Unknown failures keep the batch: the data may well be fine, and the spool keeps
                # memory in check however long this lasts.
                once.warning(f"unexpected:{type(error).__name__}",
                             "Runwatch: unexpected error sending a batch; will retry",
                             exc_info=True)
                self._retry_later(error, None)
                return
            self._done_with(item)
            self.batches_sent += 1
            self.rows_sent += item.rows
            if self._failures:
                log.info("Runwatch: delivering again after %d failed attempts", self._failures)
            self._failures = 0

    def _retry_later(self, error: Exception, retry_after: float | None) -> None:
        self.send_errors += 1
        self._failures += 1
        if retry_after is not None:
            # The server said when; a little extra spread keeps ranks from returning in lockstep.
            delay = min(retry_after, self._retry_after_max_s) * random.uniform(1.0, 1.1)
        else:
            ceiling = min(self._backoff_max_s, self._backoff_base_s * 2 ** (self._failures - 1))
            delay = ceiling * random.uniform(0.5, 1.0)
        self._next_attempt_at = time.monotonic() + delay
        # Nothing waits in memory for the collector: a process killed during the outage loses
        # at most the rows not yet batched.
        self._spill_all("the collector is away")
        if self._failures == 1:
            log.warning("Runwatch: cannot deliver metrics (%s); keeping them%s and retrying",
                        error, f" in {self._spool.directory}" if self._spool is not None else "")
        else:
            log.debug("Runwatch: attempt %d failed (%s); next in %.1f s", self._failures, error,
                      delay)
