"""The NVML sensor, against the real nvidia-ml-py where it matters and a stand-in past nvmlInit.

The real library is exercised as far as this machine lets it go: without a driver, nvmlInit fails
and telemetry must be off with one log line; on a GPU host the same test reads real GPUs. Every
reading the sensor takes is then driven through the stand-in of conftest.py (see there why), which
raises the real pynvml.NVMLError subclasses.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from types import SimpleNamespace

import pynvml
import pytest

from trainer_plugin.gpu import sampler as sampler_module
from trainer_plugin.gpu.nvml import INSTALL_HINT, NO_GPU, NvmlSensor
from trainer_plugin.gpu.sampler import THREAD_NAME, GpuSampler

from .conftest import MISSING, FakeGpu, RecordingSink, StandInNvml, nvml_error, stand_in_for


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


def no_gpu_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if NO_GPU in r.getMessage()]


def wait_for(predicate, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


# --- the real library --------------------------------------------------------------------------


def test_real_nvml_reads_gpus_where_a_driver_is_and_is_off_with_one_line_where_not(
        sink: RecordingSink, caplog: pytest.LogCaptureFixture) -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        driver_error: pynvml.NVMLError | None = exc
    else:
        driver_error = None
        pynvml.nvmlShutdown()

    sampler = GpuSampler(sink, interval_s=0.05)
    with caplog.at_level(logging.INFO, logger="runwatch"):
        started = sampler.start()
        again = sampler.start()
    try:
        if driver_error is None:  # a GPU host: the real readings arrive
            assert started and again
            assert wait_for(lambda: len(sink.rows) >= 2)
            assert sink.simulated == [False]
            for _ts, _gpu, temp_c, power_w, *_ in sink.rows[-1]:
                assert temp_c is not None and 0 < temp_c < 120
                assert power_w is None or 0 < power_w < 2000
        else:  # no driver (this suite's machines): telemetry off, said once, nothing running
            assert isinstance(driver_error, (pynvml.NVMLError_LibraryNotFound,
                                             pynvml.NVMLError_DriverNotLoaded))
            assert started is False and again is False
            lines = no_gpu_lines(caplog)
            assert len(lines) == 1, lines
            assert type(driver_error).__name__ in lines[0]
            assert sink.simulated == [] and sink.rows == []
            assert sampler_threads() == []
    finally:
        sampler.stop()
    assert sampler_threads() == []


def test_without_nvidia_ml_py_the_log_says_how_to_install_it(
        sink: RecordingSink, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with caplog.at_level(logging.INFO, logger="runwatch"):
        assert GpuSampler(sink).start() is False
    lines = no_gpu_lines(caplog)
    assert len(lines) == 1 and INSTALL_HINT in lines[0]
    assert sampler_threads() == []


def test_readings_of_the_real_library_that_fail_become_nulls_logged_once_per_field(
        caplog: pytest.LogCaptureFixture) -> None:
    # Past a stand-in nvmlInit, every reading goes to the real pynvml, which raises
    # NVMLError_Uninitialized because no library was loaded (a NULL handle keeps a GPU host safe).
    nvml = StandInNvml(nvmlInit=lambda: None, nvmlShutdown=lambda: None,
                       nvmlDeviceGetCount=lambda: 1, nvmlDeviceGetHandleByIndex=lambda i: None)
    sensor = NvmlSensor(nvml)
    assert sensor.open() is None
    assert sensor.xid_events is False  # the real nvmlEventSetCreate failed too
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="runwatch"):
        first = sensor.read(1.7e9)
        logged = len(caplog.records)
        second = sensor.read(1.7e9 + 1)
    assert first == ([(1.7e9, 0, None, None, None, None, None, None)], [])
    assert second[0][0][2:] == (None,) * 6
    assert logged == 8  # six fields and two ECC counts, each once
    assert len(caplog.records) == logged
    assert all("NVMLError" in r.getMessage() for r in caplog.records)
    sensor.close()


def test_a_gpu_that_reads_nothing_backs_the_sampler_off(
        sink: RecordingSink, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = StandInNvml(nvmlInit=lambda: None, nvmlShutdown=lambda: None,
                       nvmlDeviceGetCount=lambda: 1, nvmlDeviceGetHandleByIndex=lambda i: None)
    monkeypatch.setattr(sampler_module, "NvmlSensor", lambda: NvmlSensor(nvml))
    sampler = GpuSampler(sink, interval_s=0.01)
    with caplog.at_level(logging.WARNING, logger="runwatch"):
        assert sampler.start()
        time.sleep(0.6)
        sampler.stop()
    # 5 ticks at 10 ms, then 20, 40, 80, 160, 320 ms: about 10 in 0.6 s instead of about 60.
    assert 5 <= sampler.ticks <= 15
    assert sampler.failed_ticks == sampler.ticks
    assert any("backing off" in r.getMessage() for r in caplog.records)
    assert nvml.calls["nvmlShutdown"] == 1


# --- through the stand-in: initialisation ----------------------------------------------------------


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
                                  pynvml.NVML_ERROR_NO_PERMISSION,
                                  pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH])
def test_nvml_that_does_not_start_is_reported_with_its_error(code: int) -> None:
    def refuse() -> None:
        raise nvml_error(code)

    nvml = stand_in_for([FakeGpu(0)], nvmlInit=refuse)
    why = NvmlSensor(nvml).open()
    assert why is not None and type(nvml_error(code)).__name__ in why
    assert "nvmlShutdown" not in nvml.calls  # never initialised, so never shut down


def test_a_host_without_gpus_shuts_nvml_down_again(sink: RecordingSink,
                                                    caplog: pytest.LogCaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = stand_in_for([])
    monkeypatch.setattr(sampler_module, "NvmlSensor", lambda: NvmlSensor(nvml))
    with caplog.at_level(logging.INFO, logger="runwatch"):
        assert GpuSampler(sink).start() is False
    assert no_gpu_lines(caplog) == [f"Runwatch: {NO_GPU}: NVML found no GPU"]
    assert nvml.calls["nvmlShutdown"] == 1


def test_a_lost_gpu_is_left_out_and_the_others_are_read() -> None:
    gpus = [FakeGpu(0), FakeGpu(1)]

    def handle(index: int) -> FakeGpu:
        if index == 0:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpus[index]

    sensor = NvmlSensor(stand_in_for(gpus, nvmlDeviceGetHandleByIndex=handle))
    assert sensor.open() is None
    assert sensor.gpus == [1]
    rows, _ = sensor.read(1.7e9)
    assert [row[1] for row in rows] == [1]


# --- through the stand-in: readings -----------------------------------------------------------------


def test_each_reading_fails_alone_and_units_are_converted(caplog: pytest.LogCaptureFixture) -> None:
    gpus = [
        FakeGpu(0, fail={"temp": nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)}),
        FakeGpu(1, power_mw=700_000, used_bytes=81_559 * 1024**2, reasons=0x41,
                fail={"util": nvml_error(pynvml.NVML_ERROR_UNKNOWN)}),
    ]
    nvml = stand_in_for(gpus)
    sensor = NvmlSensor(nvml)
    assert sensor.open() is None
    with caplog.at_level(logging.WARNING, logger="runwatch"):
        rows, events = sensor.read(1.7e9)
        again, _ = sensor.read(1.7e9 + 1)
    assert rows == [
        (1.7e9, 0, None, 612.345, 97.0, 43008.0, 1980.0, 0x4),  # mW -> W, bytes -> MiB
        (1.7e9, 1, 65.0, 700.0, None, 81559.0, 1980.0, 0x41),
    ]
    assert events == []
    assert [row[2:] for row in again] == [row[2:] for row in rows]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2  # one line per failing field, not per reading
    assert "temperature of GPU 0" in messages[0] and "NVMLError_NotSupported" in messages[0]
    assert "utilisation of GPU 1" in messages[1] and "NVMLError_Unknown" in messages[1]
    # A field a GPU does not support is not asked for again; a failure that may pass is.
    assert nvml.calls["nvmlDeviceGetTemperature"] == 3
    assert nvml.calls["nvmlDeviceGetUtilizationRates"] == 4


def test_throttle_reasons_fall_back_to_the_older_nvml_name() -> None:
    older_library = stand_in_for([FakeGpu(0)], nvmlDeviceGetCurrentClocksEventReasons=MISSING,
                                 nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0x20)
    sensor = NvmlSensor(older_library)
    sensor.open()
    assert sensor.read(1.7e9)[0][0][7] == 0x20

    def not_in_this_driver(handle: FakeGpu) -> int:
        raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    older_driver = stand_in_for([FakeGpu(0)],
                                nvmlDeviceGetCurrentClocksEventReasons=not_in_this_driver,
                                nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0x8)
    sensor = NvmlSensor(older_driver)
    sensor.open()
    assert [sensor.read(1.7e9 + i)[0][0][7] for i in range(2)] == [0x8, 0x8]
    assert older_driver.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1


def test_rising_volatile_ecc_counts_are_sent_as_ecc_events() -> None:
    gpu = FakeGpu(0, sbe=5)
    sensor = NvmlSensor(stand_in_for([gpu]))
    sensor.open()

    def ecc_events(ts: float) -> list[dict]:
        return sensor.read(ts)[1]

    assert ecc_events(1.0) == []  # the first reading is the baseline
    gpu.sbe = 8
    assert ecc_events(2.0) == [{"kind": "ecc", "ts": 2.0, "gpu": 0, "volatile_sbe": 8,
                                "volatile_dbe": 0, "delta_sbe": 3, "delta_dbe": 0}]
    assert ecc_events(3.0) == []
    gpu.dbe = 1
    assert ecc_events(4.0) == [{"kind": "ecc", "ts": 4.0, "gpu": 0, "volatile_sbe": 8,
                                "volatile_dbe": 1, "delta_sbe": 0, "delta_dbe": 1}]
    gpu.sbe, gpu.dbe = 0, 0  # the driver reloaded: a new baseline, not an event
    assert ecc_events(5.0) == []
    gpu.fail["sbe"] = nvml_error(pynvml.NVML_ERROR_UNKNOWN)
    gpu.dbe = 2
    assert ecc_events(6.0) == [{"kind": "ecc", "ts": 6.0, "gpu": 0, "volatile_sbe": None,
                                "volatile_dbe": 2, "delta_sbe": None, "delta_dbe": 2}]


def test_gpus_without_ecc_send_no_ecc_events() -> None:
    not_supported = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    gpu = FakeGpu(0, fail={"sbe": not_supported, "dbe": not_supported})
    nvml = stand_in_for([gpu])
    sensor = NvmlSensor(nvml)
    sensor.open()
    for ts in range(3):
        rows, events = sensor.read(float(ts))
        assert events == [] and rows[0][2] == 65.0
    assert nvml.calls["nvmlDeviceGetTotalEccErrors"] == 2  # asked once per counter, then never


# --- through the stand-in: XID events -----------------------------------------------------------------


def xid_data(gpu: FakeGpu, xid: int) -> SimpleNamespace:
    return SimpleNamespace(device=gpu, eventType=pynvml.nvmlEventTypeXidCriticalError,
                           eventData=xid, gpuInstanceId=0, computeInstanceId=0)


def test_an_xid_event_ends_the_wait_at_once() -> None:
    gpus = [FakeGpu(0), FakeGpu(1)]

    def register(handle: FakeGpu, types: int, event_set: object) -> None:
        assert types == pynvml.nvmlEventTypeXidCriticalError
        if handle.index == 1:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    nvml = stand_in_for(gpus, nvmlDeviceRegisterEvents=register)
    sensor = NvmlSensor(nvml)
    assert sensor.open() is None
    assert sensor.xid_events  # GPU 0 can report them
    stop = threading.Event()

    began = time.monotonic()
    assert sensor.wait(0.3, stop) == []
    assert 0.25 <= time.monotonic() - began < 1.0

    nvml.events.put(xid_data(gpus[0], 79))
    began = time.monotonic()
    events = sensor.wait(10.0, stop)
    assert time.monotonic() - began < 0.5
    assert len(events) == 1
    assert events[0]["kind"] == "xid" and events[0]["gpu"] == 0 and events[0]["xid"] == 79
    assert events[0]["description"] == "GPU has fallen off the bus"
    assert abs(events[0]["ts"] - time.time()) < 5

    nvml.events.put(xid_data(gpus[0], 4242))
    (unknown,) = sensor.wait(10.0, stop)
    assert unknown["xid"] == 4242 and "description" not in unknown


def test_without_xid_support_the_event_set_is_freed_and_the_sampler_sleeps_on_its_event() -> None:
    def register(handle: FakeGpu, types: int, event_set: object) -> None:
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    nvml = stand_in_for([FakeGpu(0)], nvmlDeviceRegisterEvents=register)
    sensor = NvmlSensor(nvml)
    assert sensor.open() is None
    assert not sensor.xid_events
    assert nvml.calls["nvmlEventSetFree"] == 1
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    began = time.monotonic()
    assert sensor.wait(10.0, stop) == []
    assert time.monotonic() - began < 0.5
    assert "nvmlEventSetWait_v2" not in nvml.calls


def test_event_waits_that_keep_failing_are_given_up_without_spinning(
        caplog: pytest.LogCaptureFixture) -> None:
    def broken(event_set: object, timeout_ms: int) -> None:
        raise nvml_error(pynvml.NVML_ERROR_UNKNOWN)

    nvml = stand_in_for([FakeGpu(0)], nvmlEventSetWait_v2=broken)
    sensor = NvmlSensor(nvml)
    sensor.open()
    with caplog.at_level(logging.WARNING, logger="runwatch"):
        assert sensor.wait(1.0, threading.Event()) == []
    assert nvml.calls["nvmlEventSetWait_v2"] == 3
    assert not sensor.xid_events and nvml.calls["nvmlEventSetFree"] == 1
    assert any("no longer watching" in r.getMessage() for r in caplog.records)


def test_close_frees_the_event_set_and_shuts_nvml_down_once() -> None:
    nvml = stand_in_for([FakeGpu(0)])
    sensor = NvmlSensor(nvml)
    sensor.open()
    sensor.close()
    sensor.close()
    assert nvml.calls["nvmlEventSetFree"] == 1 and nvml.calls["nvmlShutdown"] == 1


# --- the sampler over the NVML sensor -------------------------------------------------------------------


def test_the_sampler_delivers_an_xid_at_once_and_stops_at_once_while_waiting_in_nvml(
        sink: RecordingSink, monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [FakeGpu(0), FakeGpu(1)]
    nvml = stand_in_for(gpus)
    monkeypatch.setattr(sampler_module, "NvmlSensor", lambda: NvmlSensor(nvml))
    sampler = GpuSampler(sink, interval_s=10.0)
    assert sampler.start()
    assert wait_for(lambda: len(sink.rows) == 1)
    assert sink.simulated == [False]
    assert [row[1] for row in sink.rows[0]] == [0, 1]

    nvml.events.put(xid_data(gpus[1], 48))
    assert wait_for(lambda: sink.kinds("xid"), timeout_s=1.0)
    (xid,) = sink.kinds("xid")
    assert xid["gpu"] == 1 and xid["xid"] == 48 and xid["description"] == "Double-bit ECC error"
    assert len(sink.rows) == 1  # the XID did not cost an extra reading

    began = time.monotonic()
    sampler.stop()
    assert time.monotonic() - began < 0.5
    assert sampler_threads() == []
    assert nvml.calls["nvmlShutdown"] == 1 and nvml.calls["nvmlEventSetFree"] == 1
