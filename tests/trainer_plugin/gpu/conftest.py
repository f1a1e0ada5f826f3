"""A recording sink, and a stand-in for the pynvml module.

There is no NVIDIA driver on the machines this suite runs on, so the real nvidia-ml-py cannot get
past nvmlInit (tests/trainer_plugin/gpu/test_nvml.py drives it through exactly that). To drive the
real reading code of trainer_plugin/gpu/nvml.py past initialisation, a stand-in module is handed to
NvmlSensor at its one seam, the module it looks NVML functions up on. The stand-in is minimal: it
defines only the functions a test scripts, and takes every constant and error class, and every
function it does not define, from the real pynvml, so what it raises are the real
pynvml.NVMLError subclasses.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest


@dataclass
class RecordingSink:
    rows: list[list[tuple]] = field(default_factory=list)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    simulated: list[bool] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_gpu_rows(self, rows: list[tuple]) -> None:
        with self.lock:
            self.rows.append(list(rows))

    def add_event(self, kind: str, **fields: Any) -> None:
        with self.lock:
            self.events.append((kind, fields))

    def note_simulated(self, flag: bool) -> None:
        self.simulated.append(flag)

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            return [fields for k, fields in self.events if k == kind]


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()


def nvml_error(code: int) -> pynvml.NVMLError:
    """The real pynvml exception for an NVML return code (NVMLError maps it to its subclass)."""
    return pynvml.NVMLError(code)


#: An override that makes the stand-in lack a function, as an older nvidia-ml-py would.
MISSING = object()


class StandInNvml:
    """Looks like the pynvml module: overrides are given as keyword arguments, anything else comes
    from the real module. Calls of the overrides are counted."""

    def __init__(self, **overrides: Any):
        self.calls: dict[str, int] = {}
        self._overrides = overrides

    def __getattr__(self, name: str) -> Any:
        overrides = self.__dict__.get("_overrides", {})
        if name in overrides:
            function = overrides[name]
            if function is MISSING:
                raise AttributeError(name)
            if not callable(function):
                return function

            def counted(*args: Any, **kwargs: Any) -> Any:
                self.calls[name] = self.calls.get(name, 0) + 1
                return function(*args, **kwargs)

            return counted
        return getattr(pynvml, name)


class FakeGpu:
    """A device handle with the readings the stand-in's functions return for it."""

    def __init__(self, index: int, *, temp: int = 65, power_mw: int = 612_345, util: int = 97,
                 used_bytes: int = 42 * 1024**3, sm_clock: int = 1980, reasons: int = 0x4,
                 sbe: int = 0, dbe: int = 0, fail: dict[str, BaseException] | None = None):
        self.index = index
        self.temp, self.power_mw, self.util, self.used_bytes = temp, power_mw, util, used_bytes
        self.sm_clock, self.reasons, self.sbe, self.dbe = sm_clock, reasons, sbe, dbe
        self.fail = fail or {}

    def answer(self, what: str, value: Any) -> Any:
        if what in self.fail:
            raise self.fail[what]
        return value


def stand_in_for(gpus: list[FakeGpu], **overrides: Any) -> StandInNvml:
    """A stand-in NVML that has ``gpus`` and answers every reading the sensor takes."""
    events: queue.Queue = queue.Queue()

    def event_wait(event_set: Any, timeout_ms: int) -> Any:
        try:
            return events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise nvml_error(pynvml.NVML_ERROR_TIMEOUT) from None

    def total_ecc(handle: FakeGpu, error_type: int, counter_type: int) -> int:
        assert counter_type == pynvml.NVML_VOLATILE_ECC
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return handle.answer("sbe", handle.sbe)
        assert error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        return handle.answer("dbe", handle.dbe)

    def temperature(handle: FakeGpu, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return handle.answer("temp", handle.temp)

    def clock(handle: FakeGpu, clock_type: int) -> int:
        assert clock_type == pynvml.NVML_CLOCK_SM
        return handle.answer("sm_clock", handle.sm_clock)

    functions: dict[str, Any] = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: len(gpus),
        "nvmlDeviceGetHandleByIndex": lambda i: gpus[i],
        "nvmlDeviceGetIndex": lambda h: h.index,
        "nvmlDeviceGetTemperature": temperature,
        "nvmlDeviceGetPowerUsage": lambda h: h.answer("power", h.power_mw),
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(
            gpu=h.answer("util", h.util), memory=10),
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(
            used=h.answer("mem", h.used_bytes), total=80 * 1024**3),
        "nvmlDeviceGetClockInfo": clock,
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: h.answer("reasons", h.reasons),
        "nvmlDeviceGetTotalEccErrors": total_ecc,
        "nvmlEventSetCreate": lambda: "event-set",
        "nvmlDeviceRegisterEvents": lambda h, types, event_set: None,
        "nvmlEventSetWait_v2": event_wait,
        "nvmlEventSetFree": lambda event_set: None,
    }
    functions.update(overrides)
    stand_in = StandInNvml(**functions)
    stand_in.events = events  # type: ignore[attr-defined]  # tests put XID event data here
    return stand_in
