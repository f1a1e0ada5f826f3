"""The job's timeline, decided up front: when every step ends and how long it took, when the job
saves, stalls, fails, waits and restarts, which ranks are slow and which GPUs run hot.

Everything is drawn from one seeded generator, so a config and a seed always give the same run.
The timeline is job-level (ranks step in lockstep); telemetry.py and batches.py turn it into each
rank's rows, window by window, and truth.py reads the answers off it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from collectors.simulation import evidence as evidence_catalogue
from collectors.simulation.config import GPUS_PER_HOST, SimConfig
from collectors.simulation.physics import (
    BUSY,
    CHECKPOINT,
    DOWN,
    HANG,
    STALL,
    STARTUP,
    SiteClock,
    day_cycle,
    slowdown_factor,
)

#: Resolution of the precomputed slowdown curve, seconds (it moves 0.01% a minute at most).
FACTOR_GRID_S = 60.0
#: Spread of a step's time around its expected value (data-dependent work, jitter), relative.
STEP_JITTER = 0.003
#: Spread of one rank's reported step time around the job's, relative.
RANK_JITTER = 0.002
#: A whole checkpoint (weights and optimizer state), bytes, split evenly over the saving ranks.
CHECKPOINT_BYTES = 2_400_000_000_000


@dataclass
class InterruptionPlan:
    attempt: int
    failed_at: float  # the GPUs stop computing
    ts: float  # the interruption event (after detection)
    category: str
    host: int
    gpu: int
    rank: int
    variant: evidence_catalogue.Failure
    saved_step: int  # what the next attempt resumes from
    last_step: int  # the last step completed before the failure


@dataclass
class AttemptPlan:
    number: int
    start: float
    first_step_at: float | None = None
    end: float | None = None
    resumed_from: int = 0


@dataclass
class CheckpointPlan:
    attempt: int
    kind: str  # "save" | "load"
    step: int
    ts: float  # when the save (load) finished: when the plugin records it
    duration_s: float


@dataclass
class Plan:
    config: SimConfig
    start: float
    end: float  # the last step's end: the run finishes there
    clock: SiteClock
    hosts: int
    world_size: int
    step_ranks: list[int]
    # Job-level steps, in time order (a step redone after a restart appears twice).
    step_no: np.ndarray
    step_end: np.ndarray
    step_duration: np.ndarray  # what the typical rank reports (its own compute)
    step_interval: np.ndarray  # the job's pace: the slowest rank's time
    step_attempt: np.ndarray
    step_kept: np.ndarray  # False for steps redone after an interruption
    # Job state by time: state seg_state[i] (physics.BUSY...) from seg_start[i] to seg_start[i+1].
    seg_start: np.ndarray
    seg_state: np.ndarray
    seg_attempt: np.ndarray
    attempts: list[AttemptPlan]
    checkpoints: list[CheckpointPlan]
    interruptions: list[InterruptionPlan]
    stalls: list[tuple[float, float]]  # (start, duration)
    stragglers: dict[int, float]  # rank -> relative slowdown of its own compute
    hot: dict[tuple[int, int], bool]  # (host, gpu) -> throttles
    # Per GPU (hosts × 8): busy-state mean temperature (offset and hot excess included) and power.
    gpu_base_temp: np.ndarray
    gpu_busy_power: np.ndarray
    host_phase: np.ndarray  # each host's sampler clock offset within a sample interval
    # Per host: the sampler's xid / ecc events, (ts, attempt, event).
    host_events: dict[int, list[tuple[float, int, dict]]] = field(default_factory=dict)
    noise_seed: int = 0

    def host_name(self, host: int) -> str:
        return f"node{host:03d}"

    def state_at(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(state, attempt) at each time; DOWN before the start and after the end."""
        index = np.searchsorted(self.seg_start, ts, side="right") - 1
        inside = (index >= 0) & (np.asarray(ts) < self.end)
        index = np.clip(index, 0, len(self.seg_start) - 1)
        state = np.where(inside, self.seg_state[index], DOWN)
        return state, self.seg_attempt[index]


#: Healthy ranks that report steps at least (when the cluster has them): enough that the per-step
#: median is a healthy rank's time however many slow ranks are planted.
MIN_HEALTHY_STEP_RANKS = 16


def default_step_ranks(config: SimConfig, stragglers: list[int]) -> list[int]:
    """Every rank for a small cluster; else local rank 0 of each host (more ranks per host when
    there are fewer than 16 hosts, so that at least 16 healthy ranks report) plus the slow ranks.
    That keeps a 512-GPU, 3-day backfill to minutes and still lets stragglers stand out."""
    world = config.world_size
    if config.step_ranks is not None:
        # The slow ranks always report: a straggler nobody can see is no planted fact.
        return sorted({r for r in config.step_ranks if 0 <= r < world} | {0} | set(stragglers))
    if config.gpus <= 16:
        return list(range(world))
    per_host = min(GPUS_PER_HOST, -(-MIN_HEALTHY_STEP_RANKS // config.hosts))
    slow = set(stragglers)
    chosen = set(slow)
    for host in range(config.hosts):
        # Spread over the host's GPUs, local rank 0 first, skipping slow ranks (already in).
        healthy = [host * GPUS_PER_HOST + local for local in (0, 4, 2, 6, 1, 5, 3, 7)
                   if host * GPUS_PER_HOST + local not in slow]
        chosen.update(healthy[:per_host])
    return sorted(chosen)


def _pick_gpus(rng: np.random.Generator, count: int, world: int, taken: set[int]) -> list[int]:
    free = np.array([r for r in range(world) if r not in taken])
    count = min(count, len(free))
    return sorted(int(r) for r in rng.choice(free, size=count, replace=False)) if count else []


def build_plan(config: SimConfig, start: float) -> Plan:
    rng = np.random.default_rng(config.seed)
    clock = SiteClock(config.site_timezone)
    hosts, world = config.hosts, config.world_size
    horizon = start + config.days * 86_400.0

    # Who is slow, who is hot (never the same GPU: each planted fact stays separable).
    straggler_ranks = _pick_gpus(rng, config.stragglers, world, set())
    stragglers = {r: config.straggler_slowdown * (1.0 + 0.25 * i)
                  for i, r in enumerate(straggler_ranks)}
    hot_ranks = _pick_gpus(rng, config.hot_gpus, world, set(straggler_ranks))
    hot = {(r // GPUS_PER_HOST, r % GPUS_PER_HOST): config.hot_gpus_throttle for r in hot_ranks}
    gpu_base_temp = config.base_temp_c + rng.normal(0.0, 1.5, size=(hosts, GPUS_PER_HOST))
    for (host, gpu) in hot:
        gpu_base_temp[host, gpu] += config.hot_extra_c
    gpu_busy_power = config.busy_power_w + rng.normal(0.0, 8.0, size=(hosts, GPUS_PER_HOST))
    host_phase = rng.uniform(0.0, config.sample_interval_s, size=hosts)

    # Failures: how many, when, of what, where.
    if config.interruptions is not None:
        count = config.interruptions
    else:
        count = int(rng.poisson(config.interruption_rate_per_gpu_day * config.gpus * config.days))
    slugs = sorted(config.interruption_mix)
    weights = np.array([config.interruption_mix[s] for s in slugs], dtype=float)
    earliest = start + config.startup_s + 20 * config.step_time_s
    latest = horizon - 10 * config.step_time_s
    failure_times = sorted(rng.uniform(earliest, max(earliest, latest), size=count).tolist())
    categories = [slugs[i] for i in rng.choice(len(slugs), size=count, p=weights / weights.sum())]
    failing = rng.integers(0, world, size=count).tolist()
    variant_draw = rng.random(size=count).tolist()
    stall_times = sorted(rng.uniform(earliest, max(earliest, latest), size=config.stalls).tolist())

    drag = 1.0 + max(stragglers.values(), default=0.0)
    grid_hours = clock.local_hour(np.arange(start, horizon + 2 * 86_400, FACTOR_GRID_S))
    factors = slowdown_factor(day_cycle(grid_hours, config.peak_hour_local),
                              config.diurnal_slowdown_pct)
    expected_steps = int(config.days * 86_400 / config.step_time_s * 1.2) + 64
    jitter = 1.0 + rng.normal(0.0, STEP_JITTER, size=expected_steps)

    steps_no: list[int] = []
    steps_end: list[float] = []
    steps_duration: list[float] = []
    steps_attempt: list[int] = []
    seg_start: list[float] = []
    seg_state: list[int] = []
    seg_attempt: list[int] = []
    attempts: list[AttemptPlan] = []
    checkpoints: list[CheckpointPlan] = []
    interruptions: list[InterruptionPlan] = []
    stalls: list[tuple[float, float]] = []
    host_events: dict[int, list[tuple[float, int, dict]]] = {}
    lost_ranges: list[tuple[int, int, int]] = []  # (attempt, first lost step, last lost step)

    def enter(ts: float, state: int, attempt: int) -> None:
        if seg_state and seg_state[-1] == state and seg_attempt[-1] == attempt:
            return
        seg_start.append(ts)
        seg_state.append(state)
        seg_attempt.append(attempt)

    t = start
    step = 0  # last completed step
    saved = 0  # last saved step
    number = 0
    fail_i = stall_i = 0
    jitter_i = 0
    while True:
        attempt = AttemptPlan(number=number, start=t, resumed_from=saved)
        attempts.append(attempt)
        enter(t, STARTUP, number)
        if number > 0:
            load_s = 0.4 * config.startup_s
            checkpoints.append(CheckpointPlan(number, "load", saved, t + 0.6 * config.startup_s,
                                              load_s))
        t += config.startup_s
        step = saved
        interrupted = False
        while t < horizon:
            if fail_i < count and failure_times[fail_i] < t:
                # It fell while the job was down or starting: it strikes a little later instead.
                failure_times[fail_i] = t + rng.uniform(1.0, 20.0) * config.step_time_s
            if stall_i < len(stall_times) and stall_times[stall_i] <= t:
                duration = config.stall_duration_s
                stalls.append((t, duration))
                enter(t, STALL, number)
                t += duration
                stall_i += 1
            if jitter_i >= len(jitter):
                jitter = np.concatenate([jitter, 1.0 + rng.normal(0, STEP_JITTER, expected_steps)])
            base = config.step_time_s * factors[int((t - start) // FACTOR_GRID_S)] * jitter[jitter_i]
            jitter_i += 1
            interval = base * drag
            if fail_i < count and failure_times[fail_i] < t + interval:
                failed_at = failure_times[fail_i]
                category = categories[fail_i]
                rank = int(failing[fail_i])
                host, gpu = divmod(rank, GPUS_PER_HOST)
                options = evidence_catalogue.variants(
                    category, host=f"node{host:03d}", gpu=gpu, rank=rank,
                    peer=f"10.0.{(host + 1) % max(hosts, 2)}.{17 + gpu}")
                variant = options[int(variant_draw[fail_i] * len(options))]
                detected = failed_at + evidence_catalogue.DETECTION_S.get(
                    category, evidence_catalogue.DEFAULT_DETECTION_S)
                enter(t, BUSY, number)
                enter(failed_at, HANG, number)
                enter(detected, DOWN, number)
                interruptions.append(InterruptionPlan(
                    attempt=number, failed_at=failed_at, ts=detected, category=category, host=host,
                    gpu=gpu, rank=rank, variant=variant, saved_step=saved, last_step=step))
                _sampler_events(host_events, rng, config, variant, number, host, gpu, failed_at,
                                start)
                if step > saved:
                    lost_ranges.append((number, saved + 1, step))
                attempt.end = detected
                t = detected + config.restart_downtime_s
                fail_i += 1
                number += 1
                interrupted = True
                break
            enter(t, BUSY, number)
            t += interval
            step += 1
            steps_no.append(step)
            steps_end.append(t)
            steps_duration.append(base)
            steps_attempt.append(number)
            if attempt.first_step_at is None:
                attempt.first_step_at = t
            if step % config.checkpoint_every_steps == 0:
                duration = config.checkpoint_duration_s * float(rng.uniform(0.9, 1.1))
                enter(t, CHECKPOINT, number)
                t += duration
                saved = step
                checkpoints.append(CheckpointPlan(number, "save", step, t, duration))
        if not interrupted:
            break
    end = steps_end[-1] if steps_end else t
    attempts[-1].end = end
    # Failures that were pushed past the end of the run never happened.
    del failure_times[fail_i:]

    step_no = np.array(steps_no, dtype=np.int64)
    step_attempt = np.array(steps_attempt, dtype=np.int64)
    kept = np.ones(len(step_no), dtype=bool)
    for attempt_no, first_lost, last_lost in lost_ranges:
        kept &= ~((step_attempt == attempt_no) & (step_no >= first_lost) & (step_no <= last_lost))
    durations = np.array(steps_duration)
    return Plan(
        config=config, start=start, end=end, clock=clock, hosts=hosts, world_size=world,
        step_ranks=default_step_ranks(config, straggler_ranks),
        step_no=step_no, step_end=np.array(steps_end), step_duration=durations,
        step_interval=durations * drag, step_attempt=step_attempt, step_kept=kept,
        seg_start=np.array(seg_start), seg_state=np.array(seg_state, dtype=np.int64),
        seg_attempt=np.array(seg_attempt, dtype=np.int64), attempts=attempts,
        checkpoints=checkpoints, interruptions=interruptions, stalls=stalls,
        stragglers=stragglers, hot=hot, gpu_base_temp=gpu_base_temp,
        gpu_busy_power=gpu_busy_power, host_phase=host_phase, host_events=host_events,
        noise_seed=int(rng.integers(0, 2**31)),
    )


def _sampler_events(host_events, rng, config: SimConfig, variant, attempt: int, host: int,
                    gpu: int, failed_at: float, start: float) -> None:
    """The host's GPU sampler saw it coming: the XID a moment before the crash and, for memory
    faults, volatile ECC counts that rose over the preceding hours (a GPU health page can name
    the board before it fails)."""
    events = host_events.setdefault(host, [])
    if variant.xid is not None:
        events.append((failed_at - 2.0, attempt, {"kind": "xid", "gpu": gpu, "xid": variant.xid}))
    if variant.ecc_dbe:
        sbe = 0
        for hours_before in (6.0, 3.0, 1.0):
            when = failed_at - hours_before * 3600.0 + float(rng.uniform(-300, 300))
            if when <= start + config.startup_s:
                continue
            rise = int(rng.integers(3, 40))
            sbe += rise
            # attempt -1: whichever attempt is running then (batches.py looks it up).
            events.append((when, -1, {"kind": "ecc", "gpu": gpu, "volatile_sbe": sbe,
                                      "volatile_dbe": 0, "delta_sbe": rise, "delta_dbe": 0}))
        events.append((failed_at - 1.0, attempt,
                       {"kind": "ecc", "gpu": gpu, "volatile_sbe": sbe, "volatile_dbe": 1,
                        "delta_sbe": 0, "delta_dbe": 1}))
    events.sort(key=lambda item: item[0])

