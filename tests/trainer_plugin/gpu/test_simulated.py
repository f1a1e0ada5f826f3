"""The simulated sensor: H100-like numbers, marked simulated, repeatable for a seed."""

from __future__ import annotations

import statistics
import threading

from trainer_plugin.gpu.simulated import (
    GPU_IDLE,
    MEMORY_TOTAL_MB,
    POWER_LIMIT_W,
    SimulatedSensor,
    room_temperature_c,
)

DAY_START = 1_767_225_600.0  # 2026-01-01 00:00 UTC


def readings(sensor: SimulatedSensor, start: float, seconds: int, step: float = 1.0) -> list[tuple]:
    rows: list[tuple] = []
    for i in range(int(seconds / step)):
        rows.extend(sensor.read(start + i * step)[0])
    return rows


def column(rows: list[tuple], index: int) -> list[float]:
    return [row[index] for row in rows]


def test_busy_gpus_look_like_a_training_h100() -> None:
    sensor = SimulatedSensor(seed=1)
    assert sensor.simulated is True and sensor.open() is None
    rows = readings(sensor, DAY_START, 300)
    assert len(rows) == 300 * 8 and {row[1] for row in rows} == set(range(8))
    for _ts, _gpu, temp_c, power_w, util_pct, mem_used_mb, sm_clock_mhz, throttle in rows:
        assert 55 <= temp_c <= 88
        assert 500 <= power_w <= POWER_LIMIT_W
        assert 85 <= util_pct <= 100
        assert 50_000 <= mem_used_mb <= MEMORY_TOTAL_MB
        assert 1500 <= sm_clock_mhz <= 1980 and sm_clock_mhz % 15 == 0
        assert isinstance(throttle, int) and not throttle & GPU_IDLE
    assert 600 <= statistics.mean(column(rows, 3)) <= 700


def test_idle_gpus_draw_about_a_hundred_watts_and_say_they_are_idle() -> None:
    sensor = SimulatedSensor(seed=2, busy=False)
    rows = readings(sensor, DAY_START, 120)
    assert 80 <= statistics.mean(column(rows, 3)) <= 120
    assert max(column(rows, 4)) <= 1
    assert all(row[7] == GPU_IDLE for row in rows)
    assert 25 <= statistics.mean(column(rows, 2)) <= 45


def test_temperature_follows_the_load_with_a_lag() -> None:
    load = {"busy": False}
    sensor = SimulatedSensor(seed=3, busy=lambda: load["busy"])
    idle = readings(sensor, DAY_START, 60)
    load["busy"] = True
    first_seconds = readings(sensor, DAY_START + 60, 5)
    later = readings(sensor, DAY_START + 65, 300)
    idle_temp = statistics.mean(column(idle, 2))
    assert statistics.mean(column(first_seconds, 3)) > 500  # power jumps at once ...
    assert statistics.mean(column(first_seconds, 2)) < idle_temp + 10  # ... temperature lags
    assert statistics.mean(column(later[-8 * 60:], 2)) > idle_temp + 30


def test_afternoons_run_warmer_than_nights() -> None:
    assert room_temperature_c(DAY_START + 14 * 3600) > room_temperature_c(DAY_START + 2 * 3600) + 5
    afternoon = readings(SimulatedSensor(seed=4), DAY_START + 14 * 3600, 120)
    night = readings(SimulatedSensor(seed=4), DAY_START + 2 * 3600, 120)
    assert statistics.mean(column(afternoon, 2)) > statistics.mean(column(night, 2)) + 4


def test_the_same_seed_gives_the_same_numbers() -> None:
    first = readings(SimulatedSensor(seed=7), DAY_START, 50)
    again = readings(SimulatedSensor(seed=7), DAY_START, 50)
    other = readings(SimulatedSensor(seed=8), DAY_START, 50)
    assert first == again
    assert first != other


def test_staged_faults_arrive_as_xid_and_ecc_events() -> None:
    sensor = SimulatedSensor(seed=5, gpus=2)
    assert sensor.read(DAY_START)[1] == []
    sensor.inject_xid(1, 79)
    sensor.inject_ecc(0, corrected=2, uncorrected=1)
    events = sensor.read(DAY_START + 1)[1]
    assert {"kind": "ecc", "ts": DAY_START + 1, "gpu": 0, "volatile_sbe": 2, "volatile_dbe": 1,
            "delta_sbe": 2, "delta_dbe": 1} in events
    assert {"kind": "xid", "ts": DAY_START + 1, "gpu": 1, "xid": 79,
            "description": "GPU has fallen off the bus"} in events
    assert sensor.read(DAY_START + 2)[1] == []


def test_waiting_ends_when_stopped() -> None:
    stop = threading.Event()
    stop.set()
    assert SimulatedSensor().wait(10.0, stop) == []
