"""Monitor: what a training script holds. One per process (per rank).

    mon = Monitor("llm", "llama-8b")          # or RUNWATCH_PROJECT / RUNWATCH_RUN
    for step, batch in enumerate(loader):
        ...
        mon.step(step, tokens=n_tokens, loss=loss, lr=lr)
    mon.close()

Every public method is wrapped so that nothing raises into the training loop: a monitoring bug
costs metrics, never a training run. Problems go to the "runwatch" logger.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from pathlib import Path
from types import TracebackType
from typing import Any

from trainer_plugin import environment
from trainer_plugin.protocol import (
    EVENT_KINDS,
    MAX_CONFIG_BYTES,
    MAX_ROWS,
    ProtocolError,
    make_batch,
    validate_batch,
)
from trainer_plugin.sender import Sender, json_safe, once
from trainer_plugin.transports import transport_for

log = logging.getLogger("runwatch")

_time = time.time
_perf_counter = time.perf_counter

#: Events waiting to be sent; they are rare, so this bound is only ever hit by a runaway loop.
EVENT_BUFFER = 10_000
TRACEBACK_LINES = 30
MESSAGE_CHARS = 4000

_live: weakref.WeakSet[Monitor] = weakref.WeakSet()
_hook_lock = threading.Lock()
_hook_installed = False


def _default_run_name() -> str:
    # Every rank runs the same script, so its name is a run name all ranks agree on.
    script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else ""
    return script if script and script != "-c" else "run"


def _exception_fields(exc: BaseException) -> dict[str, Any]:
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    lines = "".join(traceback.format_exception(cls, exc, exc.__traceback__)).splitlines()
    return {
        "exc_type": name,
        "message": str(exc)[:MESSAGE_CHARS],
        "traceback": "\n".join(lines[-TRACEBACK_LINES:]),
    }


def _install_excepthook() -> None:
    """Records an exception that ends the program as an interruption, for scripts that do not use
    ``with Monitor(...)``. Chains to whatever hook was there before."""
    global _hook_installed
    with _hook_lock:
        if _hook_installed:
            return
        previous = sys.excepthook

        def hook(exc_type: type[BaseException], exc: BaseException,
                 tb: TracebackType | None) -> None:
            for monitor in list(_live):
                monitor._record_failure(exc)
            previous(exc_type, exc, tb)

        sys.excepthook = hook
        _hook_installed = True


class Monitor:
    def __init__(
        self,
        project: str | None = None,
        run: str | None = None,
        *,
        url: str | None = None,
        token: str | None = None,
        attempt: int | None = None,
        config: dict[str, Any] | None = None,
        flush_interval_s: float = 1.0,
        max_batch_rows: int = 5000,
        buffer_rows: int = 200_000,
        host: str | None = None,
    ):
        # Everything step() touches exists before anything can fail, so a monitor whose setup
        # failed is a working no-op rather than an AttributeError in the training loop.
        self._accepting = False
        self._closed = False
        self._delivered = True
        self._close_lock = threading.Lock()
        self._steps: deque = deque()
        self._events: deque = deque()
        self._wake = threading.Event()
        self._buffer_rows = 200_000
        self._max_batch_rows = 5000
        self._next_step = 0
        self._last_perf: float | None = None
        self._steps_dropped = 0
        self._events_dropped = 0
        self._failure: BaseException | None = None
        self._sender: Sender | None = None
        self.environment: environment.Environment | None = None
        try:
            self._buffer_rows = max(1, int(buffer_rows))
            self._max_batch_rows = max(1, min(int(max_batch_rows), MAX_ROWS))
            self._setup(project, run, url, token, attempt, config, flush_interval_s, host)
        except Exception:
            log.warning("Runwatch is disabled: setting up the monitor failed", exc_info=True)

    def _setup(self, project: str | None, run: str | None, url: str | None, token: str | None,
               attempt: int | None, config: dict[str, Any] | None, flush_interval_s: float,
               host: str | None) -> None:
        env = environment.detect(project=project, run=run, url=url, token=token, attempt=attempt,
                                 host=host)
        self.environment = env
        if not env.url:
            log.warning("Runwatch is disabled: set RUNWATCH_URL (the collector's http(s):// address "
                        "or a redis:// broker) to send metrics")
            return
        if not env.project:
            log.warning("Runwatch is disabled: set RUNWATCH_PROJECT (or pass project=) to say which "
                        "project this run belongs to")
            return
        run_name = env.run or _default_run_name()
        run_record = {"project": env.project, "name": run_name, "attempt": env.attempt,
                      "config": self._clean_config(config)}
        source = {"host": env.host, "rank": env.rank, "local_rank": env.local_rank,
                  "world_size": env.world_size}
        try:
            # The collector would refuse every batch of a run it cannot accept; say so now, once.
            validate_batch(make_batch(run=dict(run_record), source=dict(source)))
            transport = transport_for(env.url, env.token)
        except (ProtocolError, ValueError) as error:
            log.warning("Runwatch is disabled: %s", error)
            return
        if not env.token:
            log.warning("Runwatch: RUNWATCH_TOKEN is not set; the collector will refuse metrics "
                        "without a token (create one with `manage.py createtoken %s`)",
                        env.project)
        self._sender = Sender(
            transport=transport, steps=self._steps, events=self._events, wake=self._wake,
            run=run_record, source=source, flush_interval_s=flush_interval_s,
            max_batch_rows=self._max_batch_rows, max_pending_rows=self._buffer_rows,
        )
        self._queue_event("start", self._start_fields())
        self._sender.start()
        self._accepting = True
        _live.add(self)
        _install_excepthook()
        atexit.register(self._close_at_exit)

    @staticmethod
    def _clean_config(config: Any) -> dict[str, Any]:
        if config is None:
            return {}
        if not isinstance(config, dict):
            log.warning("Runwatch: config must be a dict, got %s; not sending it",
                        type(config).__name__)
            return {}
        clean = json_safe(config)
        if len(json.dumps(clean)) > MAX_CONFIG_BYTES:
            log.warning("Runwatch: config is over %d bytes; not sending it", MAX_CONFIG_BYTES)
            return {}
        return clean

    @staticmethod
    def _start_fields() -> dict[str, Any]:
        fields: dict[str, Any] = {"pid": os.getpid(), "python": sys.version.split()[0]}
        # Never import torch ourselves: that alone costs seconds and GPU memory in some setups.
        torch = sys.modules.get("torch")
        if torch is not None:
            fields["torch"] = str(getattr(torch, "__version__", ""))
            cuda = getattr(getattr(torch, "version", None), "cuda", None)
            if cuda:
                fields["cuda"] = str(cuda)
        return fields

    @property
    def enabled(self) -> bool:
        """True when metrics are being sent (a URL and a project were given and accepted)."""
        return self._sender is not None

    # --- the hot path ---------------------------------------------------------------------------

    def step(self, step: int | None = None, *, duration_s: float | None = None,
             tokens: int | None = None, **metrics: Any) -> None:
        """Records one training step. Metric values may be numbers or 0-d tensors; they are
        converted on the sender thread. Costs about a microsecond; never blocks, never raises."""
        try:
            if not self._accepting:
                return
            perf = _perf_counter()
            if duration_s is None and self._last_perf is not None:
                duration_s = perf - self._last_perf
            self._last_perf = perf
            if step is None:
                step = self._next_step
                self._next_step = step + 1
            elif step.__class__ is int:
                self._next_step = step + 1
            steps = self._steps
            if len(steps) >= self._buffer_rows:
                # Full means the sender is far behind; dropping the newest never blocks training.
                self._steps_dropped += 1
                return
            steps.append((step, _time(), duration_s, tokens, metrics))
            if len(steps) >= self._max_batch_rows and not self._wake.is_set():
                self._wake.set()
        except Exception:
            once.warning("step", "Runwatch: Monitor.step failed; metrics may be missing",
                         exc_info=True)

    # --- events ---------------------------------------------------------------------------------

    def event(self, kind: str, /, **fields: Any) -> None:
        """Records an event: ``kind`` is one of protocol.EVENT_KINDS (e.g. "checkpoint_save");
        ``fields`` are sent with it. ``ts`` defaults to now."""
        try:
            if not self._accepting:
                return
            if kind not in EVENT_KINDS:
                once.warning(f"kind:{kind}", "Runwatch: ignoring event of unknown kind %r; kinds "
                             "are %s", kind, ", ".join(sorted(EVENT_KINDS)))
                return
            self._queue_event(kind, fields)
        except Exception:
            once.warning("event", "Runwatch: Monitor.event failed", exc_info=True)

    def _queue_event(self, kind: str, fields: dict[str, Any]) -> None:
        fields.pop("kind", None)
        ts = fields.pop("ts", None)
        if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not math.isfinite(ts) \
                or ts < 0:
            ts = _time()
        if len(self._events) >= EVENT_BUFFER:
            self._events_dropped += 1
            return
        self._events.append({"kind": kind, "ts": ts, **fields})

    # --- ending ---------------------------------------------------------------------------------

    def _record_failure(self, exc: BaseException) -> None:
        try:
            if not self._accepting or self._failure is not None:
                return
            self._failure = exc
            self._queue_event("interruption", _exception_fields(exc))
        except Exception:
            once.warning("failure", "Runwatch: recording the exception failed", exc_info=True)

    def close(self, status: str = "finished", timeout_s: float = 10.0) -> bool:
        """Sends a ``finish`` event and everything buffered, waiting at most ``timeout_s``, and
        stops the sender. Returns True when all of it was delivered. Safe to call twice."""
        try:
            with self._close_lock:
                if self._closed:
                    return self._delivered
                self._closed = True
            if self._sender is None:
                return True
            try:
                atexit.unregister(self._close_at_exit)
            except Exception:
                pass
            _live.discard(self)
            self._queue_event("finish", {"status": str(status)})
            self._accepting = False
            self._delivered = self._sender.stop(timeout_s)
            return self._delivered
        except Exception:
            once.warning("close", "Runwatch: Monitor.close failed", exc_info=True)
            return False

    def _close_at_exit(self) -> None:
        self.close("failed" if self._failure is not None else "finished")

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        # sys.exit(0) inside the block is a normal end, not a failure.
        clean_exit = exc is None or (isinstance(exc, SystemExit) and exc.code in (None, 0))
        if not clean_exit and exc is not None:
            self._record_failure(exc)
        self.close("finished" if clean_exit else "failed")
        return False  # never swallow the user's exception

    # --- numbers --------------------------------------------------------------------------------

    @property
    def stats(self) -> dict[str, int]:
        """Counters since construction: what was recorded, sent and lost."""
        sender = self._sender
        if sender is None:
            return {"steps_recorded": 0, "batches_sent": 0, "rows_sent": 0, "batches_dropped": 0,
                    "rows_dropped": self._steps_dropped + self._events_dropped, "send_errors": 0}
        return {
            "steps_recorded": sender.steps_drained + len(self._steps),
            "batches_sent": sender.batches_sent,
            "rows_sent": sender.rows_sent,
            "batches_dropped": sender.batches_dropped,
            "rows_dropped": sender.rows_dropped + self._steps_dropped + self._events_dropped,
            "send_errors": sender.send_errors,
        }
