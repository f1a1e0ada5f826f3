"""The real GPU sensor: NVML through nvidia-ml-py (imported as ``pynvml``).

Each reading of each GPU is its own ``try`` (as in wandb's and MLflow's system monitors): a field a
GPU does not support, or one read that fails, becomes ``None`` for that field only, and is logged
once. A field that answers NVMLError_NotSupported is not asked again on that GPU.

XID errors arrive through an NVML event set; its blocking wait is also the sampler's sleep, so an
XID reaches the collectors within a moment rather than at the next tick. Where the driver or GPU
cannot deliver events, the sampler sleeps on its stop event instead.

GPUs are numbered by NVML index (PCI bus order), which CUDA_VISIBLE_DEVICES does not renumber.

``pynvml`` is imported when the sensor opens, never at import time. The module object the sensor
uses is its one seam: tests on machines without a driver hand in a stand-in there.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from trainer_plugin.sender import OnceLogger

log = logging.getLogger("runwatch")

NO_GPU = "no NVIDIA GPU/NVML: GPU telemetry off"
INSTALL_HINT = "pip install 'runwatch[nvml]'"

#: Longest single blocking wait inside NVML: stop() is noticed within this, since a thread blocked
#: in C cannot be woken from Python.
EVENT_WAIT_SLICE_S = 0.2
#: Consecutive failed event waits (other than timeouts) after which XID events are given up.
EVENT_WAIT_FAILURES = 3
MIB = 1024 * 1024

#: A few XIDs an engineer meets on training clusters, from NVIDIA's XID catalogue. The collectors
#: hold the full catalogue and classify; this only makes a raw event readable in the log.
XID_DESCRIPTIONS = {
    13: "Graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double-bit ECC error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}

#: Newest name first: NVML renamed "clocks throttle reasons" to "clocks event reasons" (R535).
_THROTTLE_FUNCTIONS = ("nvmlDeviceGetCurrentClocksEventReasons",
                       "nvmlDeviceGetCurrentClocksThrottleReasons")


def _import_pynvml() -> Any:
    import pynvml

    return pynvml


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class NvmlSensor:
    """Reads every GPU of the host through NVML. ``open()`` first; ``close()`` when done."""

    simulated = False

    def __init__(self, nvml: Any = None):
        self._nvml = nvml
        self._handles: list[tuple[int, Any]] = []
        self._initialised = False
        self._event_set: Any = None
        self._event_wait: Any = None
        self._event_failures = 0
        self._throttle_functions = list(_THROTTLE_FUNCTIONS)
        self._unsupported: set[tuple[int, str]] = set()
        self._ecc: dict[int, list[int | None]] = {}
        self._once = OnceLogger(log)
        self._close_lock = threading.Lock()

    @property
    def gpus(self) -> list[int]:
        return [index for index, _ in self._handles]

    @property
    def xid_events(self) -> bool:
        """Whether XID events are being listened for."""
        return self._event_set is not None

    # --- opening and closing ---------------------------------------------------------------------

    def open(self) -> str | None:
        """Starts NVML and finds the GPUs. Returns None, or why there is no GPU telemetry."""
        if self._nvml is None:
            try:
                self._nvml = _import_pynvml()
            except ImportError:
                return f"nvidia-ml-py is not installed; on GPU hosts: {INSTALL_HINT}"
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:  # LibraryNotFound, DriverNotLoaded, NoPermission, ...
            return f"NVML did not start ({_describe(exc)})"
        self._initialised = True
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:
            self.close()
            return f"NVML could not count the GPUs ({_describe(exc)})"
        for index in range(count):
            try:
                self._handles.append((index, nvml.nvmlDeviceGetHandleByIndex(index)))
            except Exception as exc:  # a lost GPU must not hide the healthy ones
                log.warning("Runwatch: GPU %d is not readable through NVML (%s); leaving it out",
                            index, _describe(exc))
        if not self._handles:
            self.close()
            return "NVML found no GPU"
        self._listen_for_xids()
        return None

    def _listen_for_xids(self) -> None:
        nvml = self._nvml
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or getattr(nvml, "nvmlEventSetWait", None)
        xid_type = getattr(nvml, "nvmlEventTypeXidCriticalError", None)
        if wait is None or xid_type is None:
            log.info("Runwatch: this nvidia-ml-py has no NVML events; XID errors are not watched")
            return
        try:
            event_set = nvml.nvmlEventSetCreate()
        except Exception as exc:
            log.info("Runwatch: NVML events are unavailable (%s); XID errors are not watched",
                     _describe(exc))
            return
        watched = []
        for index, handle in self._handles:
            try:
                nvml.nvmlDeviceRegisterEvents(handle, xid_type, event_set)
                watched.append(index)
            except Exception as exc:  # NotSupported on some GPUs and drivers (e.g. vGPU)
                log.info("Runwatch: GPU %d cannot report XID events (%s)", index, _describe(exc))
        if not watched:
            self._free_event_set(event_set)
            return
        self._event_set = event_set
        self._event_wait = wait

    def _free_event_set(self, event_set: Any) -> None:
        try:
            self._nvml.nvmlEventSetFree(event_set)
        except Exception as exc:
            log.debug("Runwatch: freeing the NVML event set failed (%s)", _describe(exc))

    def close(self) -> None:
        """Frees the event set and shuts NVML down; idempotent, never raises."""
        with self._close_lock:
            event_set, self._event_set = self._event_set, None
            if event_set is not None:
                self._free_event_set(event_set)
            if self._initialised:
                self._initialised = False
                try:
                    self._nvml.nvmlShutdown()
                except Exception as exc:
                    log.debug("Runwatch: nvmlShutdown failed (%s)", _describe(exc))

    # --- reading ----------------------------------------------------------------------------------

    def read(self, ts: float) -> tuple[list[tuple], list[dict[str, Any]]]:
        """One row per GPU, ``(ts, gpu, temp_c, power_w, util_pct, mem_used_mb, sm_clock_mhz,
        throttle)``, and the events the reading revealed (rises of ECC error counts)."""
        nvml = self._nvml
        rows: list[tuple] = []
        events: list[dict[str, Any]] = []
        for gpu, handle in self._handles:
            temp_c = self._field(gpu, handle, "temperature", lambda h: float(
                nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)))
            power_w = self._field(gpu, handle, "power", lambda h: nvml.nvmlDeviceGetPowerUsage(h)
                                  / 1000.0)  # NVML reports milliwatts
            util_pct = self._field(gpu, handle, "utilisation", lambda h: float(
                nvml.nvmlDeviceGetUtilizationRates(h).gpu))
            mem_used_mb = self._field(gpu, handle, "memory used", lambda h: nvml
                                      .nvmlDeviceGetMemoryInfo(h).used / MIB)  # MiB, as nvidia-smi
            sm_clock_mhz = self._field(gpu, handle, "SM clock", lambda h: float(
                nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)))
            throttle = self._field(gpu, handle, "throttle reasons", self._throttle_reasons)
            rows.append((ts, gpu, temp_c, power_w, util_pct, mem_used_mb, sm_clock_mhz, throttle))
            ecc_event = self._ecc_event(ts, gpu, handle)
            if ecc_event is not None:
                events.append(ecc_event)
        return rows, events

    def _field(self, gpu: int, handle: Any, name: str, read: Any) -> Any:
        if (gpu, name) in self._unsupported:
            return None
        try:
            return read(handle)
        except Exception as exc:
            if isinstance(exc, self._error("NVMLError_NotSupported")):
                self._unsupported.add((gpu, name))
            self._once.warning(f"nvml:{name}:{type(exc).__name__}",
                               "Runwatch: cannot read the %s of GPU %d through NVML (%s); sending "
                               "null for it", name, gpu, _describe(exc))
            return None

    def _error(self, name: str) -> type[BaseException] | tuple[()]:
        error = getattr(self._nvml, name, None)
        return error if isinstance(error, type) else ()

    def _throttle_reasons(self, handle: Any) -> int:
        missing = self._error("NVMLError_FunctionNotFound")
        while True:
            function = getattr(self._nvml, self._throttle_functions[0], None)
            try:
                if function is None:
                    raise AttributeError(self._throttle_functions[0])
                return int(function(handle))
            except Exception as exc:
                # An older nvidia-ml-py or driver knows only the other name.
                if not isinstance(exc, (AttributeError, missing)) or len(self._throttle_functions) == 1:
                    raise
                self._throttle_functions.pop(0)

    def _ecc_event(self, ts: float, gpu: int, handle: Any) -> dict[str, Any] | None:
        nvml = self._nvml
        counts = [
            self._field(gpu, handle, f"volatile {label} ECC count", lambda h, kind=kind: int(
                nvml.nvmlDeviceGetTotalEccErrors(h, getattr(nvml, kind), nvml.NVML_VOLATILE_ECC)))
            for label, kind in (("corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
                                ("uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"))
        ]
        return ecc_change(self._ecc, ts, gpu, counts[0], counts[1])

    # --- waiting ----------------------------------------------------------------------------------

    def wait(self, timeout_s: float, stop: threading.Event) -> list[dict[str, Any]]:
        """Sleeps up to ``timeout_s`` (less once ``stop`` is set), returning early with the XID
        events that arrive meanwhile."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        timeout = self._error("NVMLError_Timeout")
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if self._event_set is None:
                stop.wait(remaining)
                break
            slice_s = min(remaining, EVENT_WAIT_SLICE_S)
            began = time.monotonic()
            try:
                data = self._event_wait(self._event_set, max(1, int(slice_s * 1000)))
            except Exception as exc:
                if not (timeout and isinstance(exc, timeout)):
                    self._event_wait_failed(exc)
                # A wait that returns at once must not become a busy loop.
                stop.wait(max(0.0, slice_s - (time.monotonic() - began)))
                continue
            self._event_failures = 0
            return [self._xid_event(data)]
        return []

    def _event_wait_failed(self, exc: BaseException) -> None:
        self._event_failures += 1
        self._once.warning(f"nvml:event-wait:{type(exc).__name__}",
                           "Runwatch: waiting for NVML XID events failed (%s)", _describe(exc))
        if self._event_failures >= EVENT_WAIT_FAILURES:
            log.warning("Runwatch: NVML XID events keep failing; no longer watching for them")
            with self._close_lock:
                event_set, self._event_set = self._event_set, None
                if event_set is not None:
                    self._free_event_set(event_set)

    def _xid_event(self, data: Any) -> dict[str, Any]:
        xid = int(getattr(data, "eventData", 0))
        event: dict[str, Any] = {"kind": "xid", "ts": time.time(), "gpu": self._gpu_of(data),
                                 "xid": xid}
        event_type = getattr(data, "eventType", None)
        if event_type is not None and event_type != self._nvml.nvmlEventTypeXidCriticalError:
            event["event_type"] = int(event_type)
        if xid in XID_DESCRIPTIONS:
            event["description"] = XID_DESCRIPTIONS[xid]
        return event

    def _gpu_of(self, data: Any) -> int | None:
        device = getattr(data, "device", None)
        try:
            return int(self._nvml.nvmlDeviceGetIndex(device))
        except Exception:
            return next((index for index, handle in self._handles if handle is device), None)


def ecc_change(previous: dict[int, list[int | None]], ts: float, gpu: int, sbe: int | None,
               dbe: int | None) -> dict[str, Any] | None:
    """An ``ecc`` event when a GPU's volatile ECC counts rose since the last reading, else None.

    The first reading is the baseline. A count that fell (the driver reloaded) is a new baseline;
    a count that could not be read keeps the last one known."""
    last = previous.get(gpu)
    previous[gpu] = [sbe if sbe is not None else (last[0] if last else None),
                     dbe if dbe is not None else (last[1] if last else None)]
    if last is None:
        return None
    deltas = [now - before if now is not None and before is not None else None
              for now, before in zip((sbe, dbe), last, strict=True)]
    if not any(delta is not None and delta > 0 for delta in deltas):
        return None
    return {"kind": "ecc", "ts": ts, "gpu": gpu, "volatile_sbe": sbe, "volatile_dbe": dbe,
            "delta_sbe": max(deltas[0], 0) if deltas[0] is not None else None,
            "delta_dbe": max(deltas[1], 0) if deltas[1] is not None else None}
