"""Monitor: what a training script holds. One per process (per rank).

    mon = Monitor("llm", "llama-8b")          # or RUNWATCH_PROJECT / RUNWATCH_RUN
    for step, batch in enumerate(loader):
        ...
        mon.step(step, tokens=n_tokens, loss=loss, lr=lr)
    mon.close()

Every public method is wrapped so that nothing raises into the training loop: a monitoring bug
costs metrics, never a training run. Problems go to the "runwatch" logger.

How a process's end is recorded, whatever the end is:

- a clean end: ``finish`` (status "finished") from close(), ``with`` or, failing both, atexit;
- an uncaught exception in the main thread (sys.excepthook) or any other thread
  (threading.excepthook): an ``interruption`` with ``source="exception"``, type, message, the
  traceback's tail and the thread's name;
- SIGTERM, SIGINT, SIGUSR1, SIGHUP (preemption and scheduler notices): an ``interruption`` with
  ``source="signal"`` and the main thread's stack, flushed (sent, or written to the spool) for at
  most ``SIGNAL_FLUSH_S`` before the handler that was there before runs; a default action is
  re-raised with the default handler in place, so the exit status is the one without Runwatch;
- SIGKILL and hangs cannot be caught: the sender's ``heartbeat`` every few seconds lets the
  collectors tell them apart (heartbeats without steps: a hang; neither: a kill).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import signal
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, TracebackType
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
from trainer_plugin.spool import Spool, default_root, directory_for, max_bytes_from_env
from trainer_plugin.transports import transport_for

log = logging.getLogger("runwatch")

_time = time.time
_perf_counter = time.perf_counter

#: Events waiting to be sent; they are rare, so this bound is only ever hit by a runaway loop.
EVENT_BUFFER = 10_000
TRACEBACK_LINES = 30
MESSAGE_CHARS = 4000
#: Longest a signal handler waits for the interruption to be sent or spooled before chaining.
SIGNAL_FLUSH_S = 2.0
#: Signals recorded as interruptions: termination, Ctrl-C, and the usual preemption notices.
CAPTURED_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGHUP")

_live: weakref.WeakSet[Monitor] = weakref.WeakSet()
_hook_lock = threading.Lock()
_hook_installed = False
#: signal number -> the handler that was there before ours, for the signals we handle.
_previous_handlers: dict[int, Any] = {}


def _default_run_name() -> str:
    # Every rank runs the same script, so its name is a run name all ranks agree on.
    script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else ""
    return script if script and script != "-c" else "run"


def _exception_fields(exc: BaseException, thread: threading.Thread | None = None) -> dict[str, Any]:
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    lines = "".join(traceback.format_exception(cls, exc, exc.__traceback__)).splitlines()
    return {
        "source": "exception",
        "exc_type": name,
        "message": str(exc)[:MESSAGE_CHARS],
        "traceback": "\n".join(lines[-TRACEBACK_LINES:]),
        "thread": (thread or threading.current_thread()).name,
        "pid": os.getpid(),
    }


def _signal_fields(signum: int, frame: FrameType | None, chained_to: str) -> dict[str, Any]:
    name = signal.Signals(signum).name
    stack = "".join(traceback.format_stack(frame)).splitlines() if frame is not None else []
    return {
        "source": "signal",
        "signal": name,
        "message": f"received {name}",
        # Where the main thread was: for a hang ended by the scheduler, the line it hung on.
        "traceback": "\n".join(stack[-TRACEBACK_LINES:]),
        "thread": threading.main_thread().name,
        "pid": os.getpid(),
        "chained_to": chained_to,
    }


def _describe_handler(handler: Any) -> str:
    if handler is signal.SIG_DFL:
        return "default"
    if handler is signal.default_int_handler:
        return "KeyboardInterrupt"
    return getattr(handler, "__qualname__", None) or type(handler).__name__


def _on_signal(signum: int, frame: FrameType | None) -> None:
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    try:
        for monitor in list(_live):
            monitor._record_signal(signum, frame, _describe_handler(previous))
    except BaseException:  # noqa: BLE001 - whatever happens, the previous handler must run
        pass
    if callable(previous):
        previous(signum, frame)  # e.g. Python's SIGINT handler raises KeyboardInterrupt
        return
    if previous == signal.SIG_IGN:
        return
    # SIG_DFL: put the default action back and take it, so the process ends (or stops) exactly as
    # it would have without Runwatch, exit status included.
    with _hook_lock:
        _previous_handlers.pop(signum, None)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_signal_handlers() -> None:
    """Installs the recording handler for CAPTURED_SIGNALS, chained to the handlers there now.
    Only from the main thread (Python's rule), and only where the current handler can be chained:
    one installed outside Python (getsignal() is None) is left alone, and so is SIG_IGN, because
    an ignored signal interrupts nothing."""
    if threading.current_thread() is not threading.main_thread():
        return
    with _hook_lock:
        for name in CAPTURED_SIGNALS:
            signum = getattr(signal, name, None)
            if signum is None:
                continue
            try:
                current = signal.getsignal(signum)
                if current is None or current is _on_signal or current == signal.SIG_IGN:
                    continue
                signal.signal(signum, _on_signal)
            except (OSError, ValueError, RuntimeError):
                continue
            _previous_handlers[signum] = current


def _restore_signal_handlers() -> None:
    """Puts the previous handlers back where ours is still installed, once no monitor is live."""
    if threading.current_thread() is not threading.main_thread():
        return
    with _hook_lock:
        if len(_live):
            return
        for signum, previous in list(_previous_handlers.items()):
            try:
                if signal.getsignal(signum) is _on_signal:
                    signal.signal(signum, previous)
                    del _previous_handlers[signum]
            except (OSError, ValueError, RuntimeError):
                pass


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

        previous_thread_hook = threading.excepthook

        def thread_hook(args: Any) -> None:
            # SystemExit ends only its thread, silently: not an interruption.
            if args.exc_type is not SystemExit and args.exc_value is not None:
                for monitor in list(_live):
                    monitor._record_thread_failure(args.exc_value, args.thread)
            previous_thread_hook(args)

        sys.excepthook = hook
        threading.excepthook = thread_hook
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
        capture_signals: bool = True,
        heartbeat_interval_s: float = 5.0,
        spool_dir: str | os.PathLike[str] | None = None,
        spool_max_mb: float | None = None,
        gpu_sampling: bool | str | None = None,
        gpu_interval_s: float = 1.0,
    ):
        # Everything step() touches exists before anything can fail, so a monitor whose setup
        # failed is a working no-op rather than an AttributeError in the training loop.
        self._accepting = False
        self._closed = False
        self._delivered = True
        self._close_lock = threading.Lock()
        self._steps: deque = deque()
        self._events: deque = deque()
        self._gpus: deque = deque()
        self._gpu_simulated = False
        self._gpu_sampler: Any = None
        self._gpus_dropped = 0
        self._signal_recorded: str | None = None
        self._thread_failures = 0
        self.spool: Spool | None = None
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
            self._setup(project, run, url, token, attempt, config, flush_interval_s, host,
                        capture_signals=capture_signals, heartbeat_interval_s=heartbeat_interval_s,
                        spool_dir=spool_dir, spool_max_mb=spool_max_mb)
            self._start_gpu_sampler(gpu_sampling, gpu_interval_s)
        except Exception:
            log.warning("Runwatch is disabled: setting up the monitor failed", exc_info=True)

    def _setup(self, project: str | None, run: str | None, url: str | None, token: str | None,
               attempt: int | None, config: dict[str, Any] | None, flush_interval_s: float,
               host: str | None, *, capture_signals: bool, heartbeat_interval_s: float,
               spool_dir: str | os.PathLike[str] | None, spool_max_mb: float | None) -> None:
        env = environment.detect(project=project, run=run, url=url, token=token, attempt=attempt,
                                 host=host)
        self.environment = env
        offline = os.environ.get("RUNWATCH_MODE", "").strip().lower() == "offline"
        if not env.url and not offline:
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
            transport = None if offline else transport_for(env.url or "", env.token)
        except (ProtocolError, ValueError) as error:
            log.warning("Runwatch is disabled: %s", error)
            return
        try:
            root = Path(spool_dir).expanduser() if spool_dir is not None else default_root()
            max_bytes = (int(float(spool_max_mb) * 1024 * 1024) if spool_max_mb is not None
                         else max_bytes_from_env())
            self.spool = Spool(directory_for(root, env.project, run_name, env.rank), max_bytes)
        except Exception as error:
            if offline:
                log.warning("Runwatch is disabled: offline mode needs a spool directory, and "
                            "creating it failed (%s); set RUNWATCH_SPOOL_DIR", error)
                return
            log.warning("Runwatch: no spool (%s); metrics that cannot be sent wait in memory and "
                        "may be dropped; set RUNWATCH_SPOOL_DIR to a writable directory", error)
        if offline:
            log.info("Runwatch: offline mode; metrics go to %s for `runwatch sync`",
                     self.spool.directory if self.spool else "")
        elif not env.token:
            log.warning("Runwatch: RUNWATCH_TOKEN is not set; the collector will refuse metrics "
                        "without a token (create one with `manage.py createtoken %s`)",
                        env.project)
        self._sender = Sender(
            transport=transport, steps=self._steps, events=self._events, wake=self._wake,
            run=run_record, source=source, gpus=self._gpus,
            gpu_simulated=lambda: self._gpu_simulated, spool=self.spool,
            flush_interval_s=flush_interval_s, max_batch_rows=self._max_batch_rows,
            max_pending_rows=self._buffer_rows, heartbeat_interval_s=heartbeat_interval_s,
            progress=self._last_step,
        )
        if self.spool is not None and len(self.spool):
            log.info("Runwatch: %d batches left in %s by an earlier process; sending them first",
                     len(self.spool), self.spool.directory)
        self._queue_event("start", self._start_fields())
        self._sender.start()
        self._accepting = True
        _live.add(self)
        _install_excepthook()
        if capture_signals:
            _install_signal_handlers()
        atexit.register(self._close_at_exit)

    def _last_step(self) -> int | None:
        return self._next_step - 1 if self._next_step > 0 else None

    def _start_gpu_sampler(self, gpu_sampling: bool | str | None, interval_s: float) -> None:
        """One sampler per host, on local rank 0, when trainer_plugin.gpu is installed."""
        if self._sender is None or self.environment is None or self.environment.local_rank != 0:
            return
        if gpu_sampling is None:
            raw = os.environ.get("RUNWATCH_GPU_SAMPLING", "").strip().lower()
            gpu_sampling = "simulated" if raw == "simulated" else raw not in ("0", "false", "no",
                                                                              "off")
        if gpu_sampling is False or gpu_sampling in ("0", "false", "no", "off"):
            return
        try:
            from trainer_plugin.gpu import GpuSampler  # type: ignore[attr-defined]
        except ImportError:
            log.debug("Runwatch: no GPU sampler (trainer_plugin.gpu) in this installation")
            return
        self._gpu_sampler = GpuSampler(self, interval_s=float(interval_s),
                                       simulated=gpu_sampling == "simulated")
        self._gpu_sampler.start()

    # --- the GPU sampler's sink (called from its thread) ---------------------------------------

    def add_gpu_rows(self, rows: Any) -> None:
        """Samples ``(ts, gpu, temp_c, power_w, util_pct, mem_used_mb, sm_clock_mhz, throttle)``,
        sent in the batches' ``gpus`` table. Bounded like the step buffer."""
        try:
            if not self._accepting:
                return
            gpus = self._gpus
            for row in rows:
                if len(gpus) >= self._buffer_rows:
                    self._gpus_dropped += 1
                    continue
                gpus.append(row)
        except Exception:
            once.warning("gpu", "Runwatch: Monitor.add_gpu_rows failed", exc_info=True)

    def add_event(self, kind: str, /, **fields: Any) -> None:
        """The sampler's events (xid, ECC): the same as event()."""
        self.event(kind, **fields)

    def note_simulated(self, simulated: bool) -> None:
        """The GPU samples are simulated (no NVML here); the batches say so."""
        self._gpu_simulated = bool(simulated)

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

    def _queue_event(self, kind: str, fields: dict[str, Any]) -> dict[str, Any] | None:
        fields.pop("kind", None)
        ts = fields.pop("ts", None)
        if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not math.isfinite(ts) \
                or ts < 0:
            ts = _time()
        if len(self._events) >= EVENT_BUFFER:
            self._events_dropped += 1
            return None
        event = {"kind": kind, "ts": ts, **fields}
        self._events.append(event)
        return event

    # --- checkpoints ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def checkpoint_save(self, step: int | None, path: str | os.PathLike[str]) -> Iterator[None]:
        """Wrap a checkpoint save: ``with monitor.checkpoint_save(step, path): torch.save(...)``.

        Records a ``checkpoint_save`` event with the step, the block's blocking duration, the path
        and the bytes under it (a file's size or a directory's total). The size is measured on the
        sender thread, not the training thread, shortly after the block. A block that raises
        records nothing (the exception is the user's, and goes on)."""
        started = _perf_counter()
        yield
        try:
            duration = _perf_counter() - started
            if self._accepting:
                self._queue_event("checkpoint_save", {
                    "step": step, "duration_s": duration, "path": os.fspath(path),
                    "_measure_path": os.fspath(path)})
        except Exception:
            once.warning("checkpoint", "Runwatch: recording a checkpoint failed", exc_info=True)

    def checkpoint_loaded(self, step: int | None, path: str | os.PathLike[str],
                          duration_s: float | None = None) -> None:
        """Call after restoring a checkpoint: records a ``checkpoint_load`` (step restored, path,
        bytes, and how long the load took if you measured it), from which the collectors compute
        the work lost since that step."""
        try:
            if not self._accepting:
                return
            fields: dict[str, Any] = {"step": step, "path": os.fspath(path),
                                      "_measure_path": os.fspath(path)}
            if duration_s is not None:
                fields["duration_s"] = duration_s
            self._queue_event("checkpoint_load", fields)
        except Exception:
            once.warning("checkpoint_load", "Runwatch: recording a checkpoint load failed",
                         exc_info=True)

    # --- ending ---------------------------------------------------------------------------------

    def _record_failure(self, exc: BaseException) -> None:
        try:
            if not self._accepting or self._failure is not None:
                return
            self._failure = exc
            if self._signal_recorded is not None and isinstance(exc, KeyboardInterrupt):
                return  # the signal that caused it is the interruption, with its evidence
            self._queue_event("interruption", _exception_fields(exc))
        except Exception:
            once.warning("failure", "Runwatch: recording the exception failed", exc_info=True)

    def _record_thread_failure(self, exc: BaseException, thread: threading.Thread | None) -> None:
        try:
            if not self._accepting or self._thread_failures >= 100:
                return
            self._thread_failures += 1
            self._queue_event("interruption", _exception_fields(exc, thread))
            self._wake.set()
        except Exception:
            once.warning("thread-failure", "Runwatch: recording a thread's exception failed",
                         exc_info=True)

    def _record_signal(self, signum: int, frame: FrameType | None, chained_to: str) -> None:
        """On the main thread, inside the signal handler: queue the interruption, then make sure it
        is sent or on disk (at most SIGNAL_FLUSH_S) before the previous handler may end us."""
        if not self._accepting or self._sender is None:
            return
        fields = _signal_fields(signum, frame, chained_to)
        self._signal_recorded = fields["signal"]
        event = self._queue_event("interruption", fields)
        if self._sender.flush(SIGNAL_FLUSH_S):
            return
        # The sender is stuck (a send blocking on a dead collector): write the event ourselves if
        # it is still ours to write, and copies of the batches waiting in memory (ids kept, so a
        # copy of one that does get through is stored once).
        spool = self.spool
        if spool is None:
            return
        self._sender.spool_copies()
        if event is None:
            return
        try:
            self._events.remove(event)
        except ValueError:
            return  # taken into a batch: written above, or on its way
        spool.write(make_batch(run=self._sender._run, source=self._sender._source,
                               events=[Sender._event_fields(event)]))

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
            if self._gpu_sampler is not None:
                try:
                    self._gpu_sampler.stop()
                except Exception:
                    log.debug("Runwatch: stopping the GPU sampler failed", exc_info=True)
            self._queue_event("finish", {"status": str(status)})
            self._accepting = False
            self._delivered = self._sender.stop(timeout_s)
            _restore_signal_handlers()
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
        dropped_here = self._steps_dropped + self._events_dropped + self._gpus_dropped
        if sender is None:
            return {"steps_recorded": 0, "batches_sent": 0, "rows_sent": 0, "batches_dropped": 0,
                    "rows_dropped": dropped_here, "send_errors": 0, "rows_spooled": 0,
                    "spooled_batches": 0, "heartbeats": 0}
        spool = self.spool
        return {
            "steps_recorded": sender.steps_drained + len(self._steps),
            "batches_sent": sender.batches_sent,
            "rows_sent": sender.rows_sent,
            "batches_dropped": sender.batches_dropped + (spool.batches_deleted if spool else 0),
            "rows_dropped": sender.rows_dropped + dropped_here
            + (spool.rows_deleted if spool else 0),
            "send_errors": sender.send_errors,
            # Written to disk because the collector was away (some may have been sent since).
            "rows_spooled": sender.rows_spooled,
            # Batches on disk now, waiting (this run's rank's spool directory).
            "spooled_batches": len(spool) if spool else 0,
            "heartbeats": sender.heartbeats,
        }
