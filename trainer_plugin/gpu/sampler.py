"""The GPU sampler: one daemon thread per host that reads every GPU at a fixed rate (1 Hz by
default) and hands the readings to a sink.

    sampler = GpuSampler(sink, interval_s=1.0)   # simulated=True on machines without GPUs
    sampler.start()                              # False, with one log line, without GPU/NVML
    ...
    sampler.stop()

The sink (the Monitor) receives, from the sampler's thread:

    sink.note_simulated(flag)     once, at start, so that batches carry gpus.simulated
    sink.add_gpu_rows(rows)       once per tick: [(ts, gpu, temp_c, power_w, util_pct,
                                  mem_used_mb, sm_clock_mhz, throttle), ...] for every GPU
    sink.add_event(kind, **fields)  "xid" ({ts, gpu, xid, description?}) and "ecc"
                                  ({ts, gpu, volatile_sbe, volatile_dbe, delta_sbe, delta_dbe})

One sampler per host, not per rank: the Monitor starts it on local rank 0 only.

Ticks are scheduled on the monotonic clock (tick k at start + k·interval), so a slow read delays one
tick, not all that follow; ticks missed while the process was stopped are skipped, not replayed.
Nothing here raises: a failing sensor or sink is logged once and sampling goes on; after
BACKOFF_AFTER ticks in a row that read nothing at all, the interval doubles up to MAX_INTERVAL_S
until a reading succeeds again.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Protocol

from trainer_plugin.gpu.nvml import NO_GPU, NvmlSensor
from trainer_plugin.gpu.simulated import SimulatedSensor
from trainer_plugin.sender import OnceLogger

log = logging.getLogger("runwatch")

THREAD_NAME = "runwatch-gpu"
BACKOFF_AFTER = 5
MAX_INTERVAL_S = 60.0

#: (ts, gpu, temp_c, power_w, util_pct, mem_used_mb, sm_clock_mhz, throttle)
GpuRow = tuple[float, int, float | None, float | None, float | None, float | None, float | None,
               int | None]


class Sensor(Protocol):
    simulated: bool

    def open(self) -> str | None: ...
    def read(self, ts: float) -> tuple[list[tuple], list[dict[str, Any]]]: ...
    def wait(self, timeout_s: float, stop: threading.Event) -> list[dict[str, Any]]: ...
    def close(self) -> None: ...


class GpuSink(Protocol):
    def add_gpu_rows(self, rows: list[tuple]) -> None: ...
    def add_event(self, kind: str, **fields: Any) -> None: ...
    def note_simulated(self, flag: bool) -> None: ...


class GpuSampler:
    def __init__(self, sink: GpuSink, *, interval_s: float = 1.0, simulated: bool = False,
                 seed: int | None = None):
        self._sink = sink
        self._interval_s = 1.0
        try:
            interval = float(interval_s)
            if math.isfinite(interval) and interval > 0:
                self._interval_s = interval
            else:
                raise ValueError(interval_s)
        except (TypeError, ValueError):
            log.warning("Runwatch: GPU sampling interval must be a positive number of seconds "
                        "(got %r); sampling every second", interval_s)
        self._simulated = bool(simulated)
        self._seed = seed
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._sensor: Sensor | None = None
        self._unavailable = False
        self._once = OnceLogger(log)
        self.ticks = 0
        self.failed_ticks = 0

    @property
    def sensor(self) -> Sensor | None:
        """The open sensor (a SimulatedSensor's ``busy`` can be switched through it)."""
        return self._sensor

    @property
    def interval_s(self) -> float:
        return self._interval_s

    def _new_sensor(self) -> Sensor:
        if self._simulated:
            return SimulatedSensor(seed=self._seed)
        return NvmlSensor()

    def start(self) -> bool:
        """Opens the sensor and starts the thread. False, logged once, when there is no sensor."""
        sensor: Sensor | None = None
        try:
            with self._lock:
                if self._thread is not None:
                    return self._thread.is_alive()
                if self._stop.is_set() or self._unavailable:
                    return False
                sensor = self._new_sensor()
                why = sensor.open()
                if why is not None:
                    self._unavailable = True  # said once; asking again would say it again
                    log.warning("Runwatch: %s: %s", NO_GPU, why)
                    return False
                self._sensor = sensor
                self._call_sink("note_simulated", bool(sensor.simulated))
                thread = threading.Thread(target=self._main, name=THREAD_NAME, daemon=True)
                thread.start()
                self._thread = thread
                return True
        except Exception:
            log.warning("Runwatch: starting the GPU sampler failed; GPU telemetry off",
                        exc_info=True)
            if sensor is not None and self._thread is None:
                self._close_sensor(sensor)
            return False

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stops the thread (at once, short of a read in progress) and closes the sensor."""
        try:
            self._stop.set()
            thread = self._thread
            if thread is None or thread is threading.current_thread():
                return
            thread.join(max(0.0, float(timeout_s)))
            if thread.is_alive():
                self._once.warning("stop", "Runwatch: the GPU sampler did not stop within %.1f s; "
                                   "leaving it to end with the process", timeout_s)
        except Exception:
            log.warning("Runwatch: stopping the GPU sampler failed", exc_info=True)

    # --- the thread -------------------------------------------------------------------------------

    def _main(self) -> None:
        sensor = self._sensor
        assert sensor is not None
        try:
            next_at = time.monotonic()
            failures = 0
            while not self._stop.is_set():
                if self._tick(sensor):
                    if failures >= BACKOFF_AFTER:
                        log.warning("Runwatch: GPU readings are back; sampling every %.3g s again",
                                    self._interval_s)
                    failures = 0
                else:
                    failures += 1
                    self.failed_ticks += 1
                    if failures == BACKOFF_AFTER:
                        log.warning("Runwatch: %d GPU readings in a row failed; backing off up to "
                                    "%.0f s between readings", failures, MAX_INTERVAL_S)
                interval = self._interval_s
                if failures >= BACKOFF_AFTER:
                    interval = min(MAX_INTERVAL_S,
                                   interval * 2.0 ** min(failures - BACKOFF_AFTER + 1, 32))
                next_at += interval
                now = time.monotonic()
                if next_at <= now:  # fell behind (a slow read, a suspended process): skip ahead
                    next_at += (math.floor((now - next_at) / interval) + 1) * interval
                self._sleep_until(sensor, next_at)
        except Exception:
            log.warning("Runwatch: the GPU sampler stopped after an unexpected error",
                        exc_info=True)
        finally:
            self._close_sensor(sensor)

    def _tick(self, sensor: Sensor) -> bool:
        """Reads every GPU once; True when anything at all was read."""
        try:
            rows, events = sensor.read(time.time())
        except Exception:
            self._once.warning("read", "Runwatch: reading the GPUs failed", exc_info=True)
            return False
        self.ticks += 1
        if rows:
            self._call_sink("add_gpu_rows", rows)
        self._send_events(events)
        return any(value is not None for row in rows for value in row[2:])

    def _sleep_until(self, sensor: Sensor, deadline: float) -> None:
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                events = sensor.wait(remaining, self._stop)
            except Exception:
                self._once.warning("wait", "Runwatch: waiting for GPU events failed",
                                   exc_info=True)
                self._stop.wait(max(0.0, deadline - time.monotonic()))
                return
            self._send_events(events)

    def _send_events(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            fields = dict(event)
            kind = fields.pop("kind")
            self._call_sink("add_event", kind, **fields)

    def _call_sink(self, method: str, *args: Any, **fields: Any) -> None:
        try:
            getattr(self._sink, method)(*args, **fields)
        except Exception:
            self._once.warning(f"sink:{method}", "Runwatch: handing GPU telemetry to %s failed",
                               method, exc_info=True)

    @staticmethod
    def _close_sensor(sensor: Sensor) -> None:
        try:
            sensor.close()
        except Exception:
            log.warning("Runwatch: closing the GPU sensor failed", exc_info=True)
