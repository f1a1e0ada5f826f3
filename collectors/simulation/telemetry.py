"""GPU samples of every host for one window of time, as columns: the host's sampler (local rank 0)
reads its 8 GPUs every sample interval while the job's processes are alive."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collectors.simulation import physics
from collectors.simulation.config import GPUS_PER_HOST
from collectors.simulation.plan import Plan

MEMORY_BUSY_MB = 71_500.0
MEMORY_LOADED_MB = 2_400.0


@dataclass
class HostSamples:
    """One host's samples in a window, one row per (time, GPU), in time order."""

    attempt: np.ndarray
    columns: dict[str, np.ndarray]


def window_samples(plan: Plan, w0: float, w1: float, window_index: int) -> dict[int, HostSamples]:
    """Samples with w0 <= ts < w1 for every host, keyed by host index (hosts with none left out).
    Noise is seeded by the window, so a window always reads the same."""
    config = plan.config
    interval = config.sample_interval_s
    rng = np.random.default_rng([plan.noise_seed, window_index])
    first = int(np.floor((w0 - plan.start) / interval)) - 1
    last = int(np.ceil((w1 - plan.start) / interval)) + 1
    k = np.arange(first, last + 1, dtype=np.float64)
    times = plan.start + plan.host_phase[:, None] + k[None, :] * interval  # hosts × n
    inside = (times >= w0) & (times < w1) & (times >= plan.start)
    state, attempt = plan.state_at(times)
    inside &= state != physics.DOWN
    if not inside.any():
        return {}

    cycle = physics.day_cycle(plan.clock.local_hour(times), config.peak_hour_local)
    shape = (*times.shape, GPUS_PER_HOST)
    state3 = np.broadcast_to(state[..., None], shape)
    temp = physics.temperature_c(state3, cycle[..., None], plan.gpu_base_temp[:, None, :],
                                 config.temp_swing_c)
    temp = temp + rng.normal(0.0, 0.3, size=shape)
    power = physics.power_w(state3, temp, plan.gpu_busy_power[:, None, :], config.idle_power_w,
                            config.base_temp_c)
    power = power + rng.normal(0.0, 6.0, size=shape) * physics.POWER_FRACTION[state3]
    util = physics.UTIL_PCT[state3] + np.where(state3 == physics.BUSY,
                                               rng.normal(0.0, 1.0, size=shape), 0.0)
    util = np.clip(util, 0.0, 100.0)
    busy = state3 == physics.BUSY
    memory = np.where(busy | (state3 == physics.STALL) | (state3 == physics.HANG)
                      | (state3 == physics.CHECKPOINT), MEMORY_BUSY_MB, MEMORY_LOADED_MB)
    clock = np.where(busy | (state3 == physics.STALL) | (state3 == physics.HANG),
                     physics.MAX_SM_CLOCK_MHZ, physics.IDLE_SM_CLOCK_MHZ)
    throttle = np.where(busy | (state3 == physics.STALL) | (state3 == physics.HANG), 0,
                        physics.GPU_IDLE).astype(np.int64)
    if plan.hot:
        limit = np.zeros((plan.hosts, 1, GPUS_PER_HOST), dtype=bool)
        for (host, gpu), throttles in plan.hot.items():
            limit[host, 0, gpu] = throttles
        throttled = limit & busy & (temp >= config.thermal_limit_c)
        throttle = np.where(throttled, throttle | physics.SW_THERMAL_SLOWDOWN, throttle)
        clock = np.where(throttled, clock - physics.THROTTLE_CLOCK_DROP_MHZ, clock)
        power = np.where(throttled, power - 35.0, power)

    gpu_index = np.broadcast_to(np.arange(GPUS_PER_HOST), shape)
    ts3 = np.broadcast_to(np.round(times, 3)[..., None], shape)
    attempt3 = np.broadcast_to(attempt[..., None], shape)
    out: dict[int, HostSamples] = {}
    for host in np.flatnonzero(inside.any(axis=1)):
        keep = inside[host]
        out[int(host)] = HostSamples(
            attempt=attempt3[host][keep].ravel(),
            columns={
                "ts": ts3[host][keep].ravel(),
                "gpu": gpu_index[host][keep].ravel(),
                "temp_c": np.round(temp[host][keep].ravel(), 1),
                "power_w": np.round(power[host][keep].ravel(), 1),
                "util_pct": np.round(util[host][keep].ravel(), 1),
                "mem_used_mb": memory[host][keep].ravel(),
                "sm_clock_mhz": clock[host][keep].ravel(),
                "throttle": throttle[host][keep].ravel(),
            },
        )
    return out
