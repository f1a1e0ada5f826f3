"""The sampler thread over the simulated sensor: its rate, its stop, its sink contract, and that
nothing it meets makes it raise."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from trainer_plugin.gpu import GpuSampler, SimulatedSensor
from trainer_plugin.gpu.sampler import THREAD_NAME
from trainer_plugin.protocol import EVENT_KINDS, GPU_COLUMNS, make_batch, validate_batch

from .conftest import RecordingSink


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


def test_the_sampler_ticks_at_its_interval_one_call_per_tick(sink: RecordingSink) -> None:
    sampler = GpuSampler(sink, interval_s=0.05, simulated=True, seed=1)
    assert sampler.start()
    (thread,) = sampler_threads()
    assert thread.daemon
    time.sleep(0.6)
    sampler.stop()
    assert 6 <= len(sink.rows) <= 16  # about 13; loose on purpose, CI machines stall
    assert sink.simulated == [True]
    for rows in sink.rows:
        assert [row[1] for row in rows] == list(range(8))
        assert len({row[0] for row in rows}) == 1  # one timestamp per tick
    stamps = [rows[0][0] for rows in sink.rows]
    assert all(later > earlier for earlier, later in zip(stamps, stamps[1:], strict=False))


def test_stop_is_immediate_and_idempotent(sink: RecordingSink) -> None:
    sampler = GpuSampler(sink, interval_s=10.0, simulated=True)
    assert sampler.start()
    time.sleep(0.05)
    began = time.monotonic()
    sampler.stop()
    assert time.monotonic() - began < 0.5
    assert sampler_threads() == []
    sampler.stop()
    assert sampler.start() is False  # a stopped sampler stays stopped
    assert len(sink.rows) == 1


def test_stop_before_start_and_a_second_start_are_harmless(sink: RecordingSink) -> None:
    GpuSampler(sink, simulated=True).stop()
    sampler = GpuSampler(sink, interval_s=10.0, simulated=True)
    assert sampler.start() and sampler.start()
    assert len(sampler_threads()) == 1
    sampler.stop()


class FailingSink:
    def __init__(self) -> None:
        self.calls = 0

    def add_gpu_rows(self, rows: list[tuple]) -> None:
        self.calls += 1
        raise RuntimeError("sink is broken")

    def add_event(self, kind: str, **fields: Any) -> None:
        raise RuntimeError("sink is broken")

    def note_simulated(self, flag: bool) -> None:
        raise RuntimeError("sink is broken")


def test_a_sink_that_raises_is_logged_once_and_sampling_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    sink = FailingSink()
    sampler = GpuSampler(sink, interval_s=0.02, simulated=True)
    with caplog.at_level(logging.WARNING, logger="runwatch"):
        assert sampler.start()
        assert isinstance(sampler.sensor, SimulatedSensor)
        sampler.sensor.inject_xid(0, 13)
        time.sleep(0.3)
        sampler.stop()
    assert sink.calls >= 5
    messages = [r.getMessage() for r in caplog.records]
    for method in ("add_gpu_rows", "add_event", "note_simulated"):
        assert sum(method in m for m in messages) == 1, messages
    assert sampler_threads() == []


class ExplodingSensor(SimulatedSensor):
    def read(self, ts: float) -> tuple[list[tuple], list[dict[str, Any]]]:
        raise ValueError("a bug in a sensor")


def test_a_sensor_that_raises_backs_off_and_never_kills_the_thread(
        sink: RecordingSink, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(GpuSampler, "_new_sensor", lambda self: ExplodingSensor())
    sampler = GpuSampler(sink, interval_s=0.01, simulated=True)
    with caplog.at_level(logging.WARNING, logger="runwatch"):
        assert sampler.start()
        time.sleep(0.4)
        assert len(sampler_threads()) == 1
        sampler.stop()
    assert sink.rows == []
    assert 5 <= sampler.failed_ticks <= 12  # without backing off: about 40
    messages = [r.getMessage() for r in caplog.records]
    assert sum("reading the GPUs failed" in m for m in messages) == 1
    assert any("backing off" in m for m in messages)


def test_a_bad_interval_falls_back_to_one_second(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="runwatch"):
        assert GpuSampler(RecordingSink(), interval_s=float("nan")).interval_s == 1.0
        assert GpuSampler(RecordingSink(), interval_s=-1).interval_s == 1.0
        assert GpuSampler(RecordingSink(), interval_s="soon").interval_s == 1.0  # type: ignore[arg-type]
    assert len(caplog.records) == 3


def test_what_the_sampler_hands_over_fits_the_wire_format(sink: RecordingSink) -> None:
    sampler = GpuSampler(sink, interval_s=0.02, simulated=True, seed=3)
    assert sampler.start()
    assert isinstance(sampler.sensor, SimulatedSensor)
    sampler.sensor.inject_ecc(2, uncorrected=1)
    sampler.sensor.inject_ecc(2, uncorrected=1)
    sampler.sensor.inject_xid(5, 94)
    time.sleep(0.2)
    sampler.stop()
    rows = [row for tick in sink.rows for row in tick]
    gpus = {name: [row[i] for row in rows] for i, name in enumerate(GPU_COLUMNS)}
    gpus["simulated"] = sink.simulated[0]
    events = [{"kind": kind, **fields} for kind, fields in sink.events]
    assert {event["kind"] for event in events} <= EVENT_KINDS
    assert {"xid", "ecc"} <= {event["kind"] for event in events}
    batch = make_batch(run={"project": "llm", "name": "demo", "attempt": 0},
                       source={"host": "node001", "rank": 0, "local_rank": 0, "world_size": 1},
                       gpus=gpus, events=events)
    validated = validate_batch(batch)
    assert validated["gpus"]["simulated"] is True
