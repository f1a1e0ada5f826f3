"""A simulated GPU sensor for demos and tests on machines without GPUs.

Its numbers look like an 8×H100 SXM host (700 W board limit, 80 GB): temperature follows the load
with a lag of about half a minute, power sits near 600–700 W while ``busy`` and near 100 W idle,
hot GPUs lose a little SM clock, and a slow day/night swing of the room's temperature (warmest at
14:00 UTC) runs under it all, so the dashboard's time-of-day charts have something to show. Every
batch it feeds says ``"simulated": true``; nothing it sends can pass for a real reading.

Deterministic for a seed: the same seed and the same timestamps give the same rows.
"""

from __future__ import annotations

import math
import random
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from trainer_plugin.gpu.nvml import XID_DESCRIPTIONS, ecc_change

MEMORY_TOTAL_MB = 81_559.0  # an H100 80GB HBM3 as nvidia-smi shows it, in MiB
POWER_LIMIT_W = 700.0
MAX_SM_CLOCK_MHZ = 1980.0
IDLE_SM_CLOCK_MHZ = 345.0
#: Time constant of the temperature's lag behind the load, seconds.
THERMAL_LAG_S = 30.0

# Clock event reason bits, as NVML numbers them (nvmlClocksEventReason*).
GPU_IDLE = 0x1
SW_POWER_CAP = 0x4
SW_THERMAL_SLOWDOWN = 0x20


def room_temperature_c(ts: float) -> float:
    """The data hall's air: 24 °C ± 3 °C over the day, warmest at 14:00 UTC."""
    hour = (ts % 86_400) / 3600
    return 24.0 + 3.0 * math.cos(2 * math.pi * (hour - 14) / 24)


class SimulatedSensor:
    simulated = True

    def __init__(self, *, gpus: int = 8, seed: int | None = None,
                 busy: bool | Callable[[], bool] = True):
        self.busy = busy
        self._rng = random.Random(seed)
        self._gpus = max(1, int(gpus))
        # Each board has its own character: its place in the chassis airflow, its silicon.
        self._temp_offset = [self._rng.gauss(0, 2.0) for _ in range(self._gpus)]
        self._power_offset = [self._rng.gauss(0, 12.0) for _ in range(self._gpus)]
        self._memory_mb = [62_000.0 + self._rng.uniform(0, 8_000) for _ in range(self._gpus)]
        self._temps: list[float] | None = None
        self._last_ts: float | None = None
        self._ecc_counts = [[0, 0] for _ in range(self._gpus)]
        self._ecc_seen: dict[int, list[int | None]] = {}
        self._xids: deque = deque()
        self._lock = threading.Lock()

    @property
    def gpus(self) -> list[int]:
        return list(range(self._gpus))

    def open(self) -> str | None:
        return None

    def close(self) -> None:
        pass

    def is_busy(self) -> bool:
        busy = self.busy
        return bool(busy() if callable(busy) else busy)

    # --- faults a demo or a test can stage ------------------------------------------------------

    def inject_xid(self, gpu: int, xid: int) -> None:
        """Reports ``xid`` on ``gpu`` with the next reading."""
        self._xids.append((int(gpu), int(xid)))

    def inject_ecc(self, gpu: int, *, corrected: int = 0, uncorrected: int = 0) -> None:
        """Raises ``gpu``'s volatile ECC counts; the next reading sends an ``ecc`` event."""
        with self._lock:
            self._ecc_counts[gpu][0] += max(0, int(corrected))
            self._ecc_counts[gpu][1] += max(0, int(uncorrected))

    # --- the sensor contract --------------------------------------------------------------------

    def read(self, ts: float) -> tuple[list[tuple], list[dict[str, Any]]]:
        rng = self._rng
        busy = self.is_busy()
        room = room_temperature_c(ts)
        targets = [room + offset + (46.0 if busy else 10.0) for offset in self._temp_offset]
        if self._temps is None or self._last_ts is None:
            self._temps = list(targets)
            dt = 0.0
        else:
            dt = min(max(ts - self._last_ts, 0.0), 600.0)
        self._last_ts = ts
        approach = 1.0 - math.exp(-dt / THERMAL_LAG_S)

        rows: list[tuple] = []
        events: list[dict[str, Any]] = []
        for gpu in range(self._gpus):
            temp = self._temps[gpu] + (targets[gpu] - self._temps[gpu]) * approach
            temp += rng.gauss(0, 0.3)
            self._temps[gpu] = temp
            if busy:
                util = min(100.0, max(85.0, 98.0 + rng.gauss(0, 1.5)))
                power = 645.0 + self._power_offset[gpu] + 1.2 * (temp - 70.0) + rng.gauss(0, 18.0)
                power = min(POWER_LIMIT_W, max(520.0, power))
                clock = MAX_SM_CLOCK_MHZ - 12.0 * max(0.0, temp - 72.0) - rng.choice((0, 0, 15, 30))
                throttle = 0
                if power >= POWER_LIMIT_W - 10:
                    throttle |= SW_POWER_CAP
                    clock -= 60.0
                if temp >= 83.0:
                    throttle |= SW_THERMAL_SLOWDOWN
                memory = self._memory_mb[gpu] + rng.uniform(-200, 200)
            else:
                util = float(rng.choice((0, 0, 0, 1)))
                power = 95.0 + 0.5 * (temp - 35.0) + rng.gauss(0, 4.0)
                clock = IDLE_SM_CLOCK_MHZ
                throttle = GPU_IDLE
                memory = 520.0
            rows.append((ts, gpu, round(temp, 1), round(power, 1), round(util, 1),
                         round(min(memory, MEMORY_TOTAL_MB), 1), float(round(clock / 15) * 15),
                         throttle))
            with self._lock:
                sbe, dbe = self._ecc_counts[gpu]
            event = ecc_change(self._ecc_seen, ts, gpu, sbe, dbe)
            if event is not None:
                events.append(event)
        while self._xids:
            gpu, xid = self._xids.popleft()
            event = {"kind": "xid", "ts": ts, "gpu": gpu, "xid": xid}
            if xid in XID_DESCRIPTIONS:
                event["description"] = XID_DESCRIPTIONS[xid]
            events.append(event)
        return rows, events

    def wait(self, timeout_s: float, stop: threading.Event) -> list[dict[str, Any]]:
        stop.wait(max(0.0, timeout_s))
        return []
