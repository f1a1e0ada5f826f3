"""What a simulated run is asked to be (SimConfig) and what it turned out to be (GroundTruth).

The numbers behind the defaults come from the Llama 3 405B report (Dubey et al., 2024, §3.3.4):
466 job interruptions in 54 days on up to 16,384 H100 GPUs, 419 of them unexpected, with the
root-cause mix of its Table 5; a 1–2% throughput swing with the time of day.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

GPUS_PER_HOST = 8

#: Llama 3: 419 unexpected interruptions in 54 days on 16,384 GPUs.
LLAMA3_UNEXPECTED = 419
LLAMA3_DAYS = 54.0
LLAMA3_GPUS = 16_384
#: Unexpected interruptions per GPU-day (~4.7e-4): a 16k-GPU cluster sees ~7.8 a day, a 512-GPU
#: one about one every four days.
LLAMA3_RATE_PER_GPU_DAY = LLAMA3_UNEXPECTED / (LLAMA3_DAYS * LLAMA3_GPUS)

#: Table 5 of the Llama 3 report (the 419 unexpected interruptions), mapped to our category slugs;
#: rows that land on one slug are summed:
#:   gpu_hardware      faulty GPU 148, GPU SRAM 19, GPU system processor 17,
#:                     silent data corruption 6, GPU thermal interface + sensor 6      = 196
#:   gpu_memory        GPU HBM3 memory                                                 = 72
#:   software_bug      software bug                                                    = 54
#:   network           network switch/cable 35, NIC 7                                  = 42
#:   host_maintenance  unplanned host maintenance                                      = 32
#:   nccl_timeout      NCCL watchdog timeouts                                          = 7
#:   host              power supply 3, server chassis 2, IO expansion board 2, CPU 2,
#:                     system memory 2                                                 = 11
#:   storage           SSD 3, dependency (the shared storage service) 2                = 5
LLAMA3_MIX: dict[str, int] = {
    "gpu_hardware": 196,
    "gpu_memory": 72,
    "software_bug": 54,
    "network": 42,
    "host_maintenance": 32,
    "nccl_timeout": 7,
    "host": 11,
    "storage": 5,
}


@dataclass
class SimConfig:
    """One simulated training run. Every default is chosen so that a small config (16–32 GPUs,
    1–2 days) stores in well under a minute and a 512-GPU, 3-day run in minutes."""

    run_name: str = "sim-cluster"
    project: str = "sim"
    gpus: int = 32  # 8 per host; rounded up to whole hosts
    days: float = 1.0
    seed: int = 0
    #: Aware datetime (UTC) of the run's first start; None means ``now - days``.
    start: datetime | None = None
    site_timezone: str = "America/Chicago"
    #: GPU telemetry period, seconds. NVML runs at 1 Hz on a real job; 10 s keeps a backfill small.
    sample_interval_s: float = 10.0
    #: Seconds of a backfill one batch of one rank covers. The plugin flushes every few seconds; a
    #: backfill sends an hour per batch, because every batch costs the collectors a transaction.
    flush_interval_s: float = 3600.0
    #: Nominal step time at the coolest hour of the day, seconds.
    step_time_s: float = 6.0
    tokens_per_step: int = 4_194_304  # 4M-token global batch, per step
    #: Peak-to-trough step-time slowdown from the site's day/night temperature cycle, percent.
    diurnal_slowdown_pct: float = 1.5
    #: Local hour of the day's hottest point (and the slowest steps).
    peak_hour_local: float = 15.0
    #: Mean GPU temperature (°C) and the day/night swing around it (peak to trough).
    base_temp_c: float = 62.0
    temp_swing_c: float = 8.0
    busy_power_w: float = 690.0
    idle_power_w: float = 90.0
    checkpoint_every_steps: int = 500
    checkpoint_duration_s: float = 60.0
    #: Unexpected interruptions per GPU-day (Llama 3 by default), and their category mix.
    interruption_rate_per_gpu_day: float = LLAMA3_RATE_PER_GPU_DAY
    interruption_mix: dict[str, int] = field(default_factory=lambda: dict(LLAMA3_MIX))
    #: Exact number of interruptions to plant; None draws it from the rate (Poisson).
    interruptions: int | None = None
    #: Seconds from an interruption to the next attempt's start (job requeue, node swap).
    restart_downtime_s: float = 600.0
    #: Seconds from an attempt's start to its first step (loading the checkpoint, NCCL init).
    startup_s: float = 120.0
    #: Collective stalls (all ranks wait, power drops) that recover by themselves.
    stalls: int = 1
    stall_duration_s: float = 120.0
    stragglers: int = 2
    straggler_slowdown: float = 0.08  # the slow rank's own compute takes 8% longer
    hot_gpus: int = 2
    #: How much hotter a hot GPU runs than its neighbours (a blocked air path, a dried-out pad).
    hot_extra_c: float = 21.0
    #: Whether hot GPUs hit the thermal limit and report throttle bits (they do in the warm hours).
    hot_gpus_throttle: bool = True
    #: Board temperature at which the driver slows the clocks (SW thermal slowdown).
    thermal_limit_c: float = 83.0
    #: Ranks that send step rows; None = every rank when gpus <= 64, else local rank 0 of each host
    #: plus every straggler (the CLI's default for large clusters).
    step_ranks: list[int] | None = None
    #: Stream at wall-clock pace instead of backfilling as fast as possible.
    live: bool = False
    #: Hand batches to a running Celery worker (``ingest_batch.delay``) instead of in-process.
    via_broker: bool = False

    @property
    def hosts(self) -> int:
        return -(-self.gpus // GPUS_PER_HOST)

    @property
    def world_size(self) -> int:
        return self.hosts * GPUS_PER_HOST

    def resolved_start(self, now: datetime | None = None) -> datetime:
        if self.start is not None:
            return self.start.astimezone(UTC)
        now = now or datetime.now(UTC)
        return (now - timedelta(days=self.days)).replace(microsecond=0)


@dataclass
class GroundTruth:
    """What the simulator planted, in the terms the analyses report it. JSON via ``as_dict()``."""

    run_id: int
    run_name: str
    project: str
    gpus: int
    hosts: int
    start: datetime
    end: datetime
    site_timezone: str
    #: Peak-to-trough of tokens/s per local hour as % of the run median.
    diurnal_amplitude_pct: float = 0.0
    #: Tokens/s per local hour 0..23 as % deviation from the run median (None: no steps that hour).
    hourly_deviation_pct: list[float | None] = field(default_factory=list)
    #: {"start", "end", "delta_kw", "cause"} by |delta_kw| descending.
    swings: list[dict[str, Any]] = field(default_factory=list)
    #: Unexpected interruptions per category slug.
    interruptions: dict[str, int] = field(default_factory=dict)
    unexpected_interruptions: int = 0
    ettr: float = 1.0
    #: {"rank", "host", "gpu", "slowdown"}
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    #: {"host", "gpu", "extra_c", "throttling"}
    hot_gpus: list[dict[str, Any]] = field(default_factory=list)
    #: Extra facts (checkpoints, attempts, rows sent) for tests and the printed summary.
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["start"] = self.start.isoformat()
        data["end"] = self.end.isoformat()
        return data
