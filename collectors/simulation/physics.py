"""The site's day/night cycle and what each GPU draws and reads in each state of the job.

Pure numpy, shared by the telemetry generator (which adds noise) and the ground truth (which does
not), so the power levels the truth reports are exactly the ones the samples scatter around.
"""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import numpy as np

# Job states, in the order of the arrays below.
BUSY, CHECKPOINT, STALL, HANG, STARTUP, DOWN = range(6)
STATE_NAMES = ("busy", "checkpoint", "stall", "hang", "startup", "down")

#: Board power by state, as a fraction of the busy level: saving a checkpoint leaves the GPUs
#: nearly idle while the host writes; a stalled collective spins in NCCL kernels (100% "util",
#: little power); a failed job's survivors hang the same way until they are killed; a starting
#: attempt has CUDA contexts and weights loading, nothing computing.
POWER_FRACTION = np.array([1.0, 0.38, 0.26, 0.26, 0.16, 0.0])
#: Temperature below the busy level, °C, by state (the board cools when it stops computing).
COOLING_C = np.array([0.0, 9.0, 12.0, 12.0, 20.0, 20.0])
UTIL_PCT = np.array([97.0, 8.0, 100.0, 100.0, 0.0, 0.0])
#: Watts per °C above the mean: hotter silicon leaks more.
LEAKAGE_W_PER_C = 1.5
MAX_SM_CLOCK_MHZ = 1980.0
IDLE_SM_CLOCK_MHZ = 345.0
# NVML clock event reason bits (nvmlClocksEventReason*).
GPU_IDLE = 0x1
SW_THERMAL_SLOWDOWN = 0x20
#: The clock a thermally throttled H100 falls back to, MHz below the maximum.
THROTTLE_CLOCK_DROP_MHZ = 240.0


class SiteClock:
    """Local time of day at the cluster's site, vectorised (DST included)."""

    def __init__(self, timezone: str):
        self.zone = ZoneInfo(timezone)
        self._offsets: dict[int, float] = {}

    def _offset_s(self, hour_index: int) -> float:
        offset = self._offsets.get(hour_index)
        if offset is None:
            when = datetime.fromtimestamp(hour_index * 3600, tz=UTC).astimezone(self.zone)
            offset = self._offsets[hour_index] = when.utcoffset().total_seconds()
        return offset

    def local_seconds(self, ts: np.ndarray) -> np.ndarray:
        """Unix seconds shifted by the site's UTC offset at that moment."""
        ts = np.asarray(ts, dtype=np.float64)
        hours = np.floor(ts / 3600).astype(np.int64)
        unique, inverse = np.unique(hours, return_inverse=True)
        offsets = np.array([self._offset_s(int(h)) for h in unique])
        return ts + offsets[inverse].reshape(ts.shape)

    def local_hour(self, ts: np.ndarray) -> np.ndarray:
        """Fractional hour of the local day, 0 <= h < 24."""
        return (self.local_seconds(ts) % 86_400) / 3600.0


def day_cycle(hours: np.ndarray, peak_hour: float) -> np.ndarray:
    """The site's day/night cycle: +1 at the hottest hour, -1 twelve hours later."""
    return np.cos(2 * np.pi * (np.asarray(hours) - peak_hour) / 24.0)


def slowdown_factor(cycle: np.ndarray, slowdown_pct: float) -> np.ndarray:
    """Step-time multiplier: 1 at the coolest hour, 1 + slowdown_pct/100 at the hottest."""
    return 1.0 + (slowdown_pct / 100.0) * (np.asarray(cycle) + 1.0) / 2.0


def temperature_c(state: np.ndarray, cycle: np.ndarray, base_c: np.ndarray,
                  swing_c: float) -> np.ndarray:
    """Expected board temperature (no noise): the GPU's busy mean (``base_c``, its own offset and
    any hot-spot excess included), the site's swing, less the cooling of a non-busy state."""
    return base_c + (swing_c / 2.0) * cycle - COOLING_C[state]


def power_w(state: np.ndarray, temp_c: np.ndarray, busy_w: np.ndarray, idle_w: float,
            base_temp_c: float) -> np.ndarray:
    """Expected board power (no noise): between idle and the GPU's busy level by state, plus
    leakage that rises with temperature (only while the board is powered up by work)."""
    fraction = POWER_FRACTION[state]
    level = idle_w + (busy_w - idle_w) * fraction
    return level + LEAKAGE_W_PER_C * (temp_c - base_temp_c) * fraction
