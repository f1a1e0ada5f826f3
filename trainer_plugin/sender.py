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
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer_plugin.protocol import _METRIC_NAME, MAX_EVENTS, MAX_METRICS, make_batch
from trainer_plugin.transports import PermanentSendError, TransientSendError, Transport

log = logging.getLogger("runwatch")
_isfinite = math.isfinite

#: One buffered step: (step, ts, duration_s, tokens, metrics), exactly as the training loop gave
#: them; nothing is converted on the hot path.
StepRow = tuple[Any, float, Any, Any, dict[str, Any]]

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
    attempts: int = 0


class Sender:
    def __init__(
        self,
        *,
        transport: Transport,
        steps: deque,
        events: deque,
        wake: threading.Event,
        run: dict[str, Any],
        source: dict[str, Any],
        flush_interval_s: float = 1.0,
        max_batch_rows: int = 5000,
        max_pending_rows: int = 200_000,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 60.0,
        retry_after_max_s: float = 300.0,
    ):
        self._transport = transport
        self._steps = steps
        self._events = events
        self._wake = wake
        self._run = run
        self._source = source
        self._flush_interval_s = max(0.001, flush_interval_s)
        self._max_batch_rows = max(1, max_batch_rows)
        self._max_pending_rows = max(self._max_batch_rows, max_pending_rows)
        self._backoff_base_s = backoff_base_s
        self._backoff_max_s = backoff_max_s
        self._retry_after_max_s = retry_after_max_s

        self._pending: deque[PendingBatch] = deque()
        self._pending_rows = 0
        self._next_attempt_at = 0.0  # time.monotonic() before which no send is tried
        self._failures = 0  # consecutive transient failures
        self._stopping = threading.Event()
        self._deadline = math.inf
        self._abandoned_at_close = 0
        self._thread = threading.Thread(target=self._main, name="runwatch-sender", daemon=True)

        self.steps_drained = 0
        self.batches_sent = 0
        self.rows_sent = 0
        self.batches_dropped = 0
        self.rows_dropped = 0
        self.send_errors = 0

    # --- called from the monitor --------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float) -> bool:
        """Sends everything still buffered, trying until ``timeout_s`` has passed, then stops.
        Returns True when all of it was delivered."""
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
        return not self._abandoned_at_close and not self._steps and not self._events

    # --- the thread ---------------------------------------------------------------------------

    def _main(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self._wait_s())
            self._wake.clear()
            if self._stopping.is_set():
                break
            self._guarded(self._cycle)
        self._guarded(self._final_flush)
        try:
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

    def _wait_s(self) -> float:
        if self._pending:
            return max(0.001, min(self._flush_interval_s,
                                  self._next_attempt_at - time.monotonic()))
        return self._flush_interval_s

    def _past_deadline(self) -> bool:
        return time.monotonic() >= self._deadline

    def _backing_off(self) -> bool:
        return bool(self._pending) and time.monotonic() < self._next_attempt_at

    def _cycle(self) -> None:
        # While backing off, rows stay in the buffer until they fill a whole batch: an outage then
        # leaves a few full batches waiting, not one tiny batch per flush interval.
        self._batch_up(full_only=self._backing_off())
        self._send_pending(deadline=math.inf)

    def _final_flush(self) -> None:
        # The process is ending: one immediate try is worth more than the rest of a backoff.
        if self._failures:
            self._next_attempt_at = time.monotonic()
        while True:
            # One batch at a time, so that the deadline is checked between conversions and a
            # full buffer cannot keep this thread busy past close().
            self._batch_up(full_only=False, max_batches=1, batch_rows=CLOSING_BATCH_ROWS)
            if not (self._pending or self._steps or self._events):
                return
            now = time.monotonic()
            if now >= self._deadline or self._next_attempt_at >= self._deadline:
                break
            if now < self._next_attempt_at:
                time.sleep(self._next_attempt_at - now)
                continue
            self._send_pending(deadline=self._deadline)
        while self._pending:
            self._abandoned_at_close += 1
            self._drop(self._pending.popleft(), "not delivered before close")
        # Rows never even converted: counted, not sent.
        steps, events = len(self._steps), len(self._events)
        self._steps.clear()
        self._events.clear()
        self.steps_drained += steps
        self.rows_dropped += steps + events
        self._abandoned_at_close += bool(steps or events)

    # --- batching -----------------------------------------------------------------------------

    def _batch_up(self, *, full_only: bool, max_batches: float = math.inf,
                  batch_rows: int | None = None) -> None:
        limit = min(self._max_batch_rows, batch_rows or self._max_batch_rows)
        made = 0
        while (self._events or self._steps) and made < max_batches:
            if time.monotonic() >= self._deadline:
                return  # close() has given up waiting; _final_flush counts what is left
            made += 1
            if full_only and len(self._steps) + len(self._events) < limit:
                return
            events = _take(self._events, min(limit, MAX_EVENTS))
            rows = _take(self._steps, limit - len(events))
            self.steps_drained += len(rows)
            try:
                table, skipped = step_columns(rows, self._past_deadline)
            except DeadlinePassed:
                self.rows_dropped += len(rows) + len(events)
                self._abandoned_at_close += 1
                return
            self.rows_dropped += skipped
            batch = make_batch(run=self._run, source=self._source, steps=table,
                               events=[json_safe(event) for event in events])
            self._enqueue(PendingBatch(batch, len(table["step"]) + len(events)))

    def _enqueue(self, item: PendingBatch) -> None:
        self._pending.append(item)
        self._pending_rows += item.rows
        while self._pending_rows > self._max_pending_rows and len(self._pending) > 1:
            self._drop(self._pending.popleft(), "too much undelivered data")

    def _drop(self, item: PendingBatch, why: str) -> None:
        # The caller has already taken ``item`` off the pending list.
        self._pending_rows -= item.rows
        self._on_undeliverable(item.batch, item.rows, why)

    def _on_undeliverable(self, batch: dict[str, Any], rows: int, why: str) -> None:
        """A batch that will not be delivered from memory. The seam for the disk spool: a spool
        writes it here and replays it later with the same batch_id; for now it is counted."""
        self.batches_dropped += 1
        self.rows_dropped += rows
        once.warning(f"undeliverable:{why}",
                     "Runwatch: dropping undelivered metrics (%s); stats['rows_dropped'] counts "
                     "them", why)

    # --- delivery -----------------------------------------------------------------------------

    def _send_pending(self, deadline: float) -> None:
        while self._pending:
            now = time.monotonic()
            deadline = min(deadline, self._deadline)
            if now < self._next_attempt_at or now >= deadline:
                return
            item = self._pending[0]
            item.attempts += 1
            try:
                self._transport.send(item.batch, timeout_s=deadline - now
                                     if deadline != math.inf else None)
            except PermanentSendError as error:
                self.send_errors += 1
                # Retrying a batch the collector refused would only refuse it again.
                once.warning(f"permanent:{error}", "Runwatch: the collector refused a batch of "
                             "%d rows, which is dropped: %s", item.rows, error)
                self._pending.popleft()
                self._pending_rows -= item.rows
                self.batches_dropped += 1
                self.rows_dropped += item.rows
                continue
            except TransientSendError as error:
                self._retry_later(error, error.retry_after)
                return
            except Exception as error:
                # Unknown failures keep the batch: the data may well be fine, and the pending
                # bound keeps memory in check however long this lasts.
                once.warning(f"unexpected:{type(error).__name__}",
                             "Runwatch: unexpected error sending a batch; will retry",
                             exc_info=True)
                self._retry_later(error, None)
                return
            self._pending.popleft()
            self._pending_rows -= item.rows
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
        if self._failures == 1:
            log.warning("Runwatch: cannot deliver metrics (%s); keeping them and retrying", error)
        else:
            log.debug("Runwatch: attempt %d failed (%s); next in %.1f s", self._failures, error,
                      delay)
