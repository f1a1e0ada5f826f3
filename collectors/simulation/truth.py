"""The ground truth of a planned run, in the terms the analyses report it (DESIGN.md)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

import numpy as np

from collectors.simulation import physics
from collectors.simulation.config import GPUS_PER_HOST, GroundTruth
from collectors.simulation.evidence import EXPECTED_CATEGORIES
from collectors.simulation.plan import Plan


def hourly_throughput(plan: Plan) -> tuple[list[float | None], float]:
    """Tokens/s per local hour (0..23) as % deviation from the run median, and the peak-to-trough
    of those 24 numbers. A step's tokens/s is the global batch's tokens over the step time the
    typical rank reports (the per-step median of ``duration_s``); an hour's figure is its steps'
    tokens over their summed step time, steps filed under the local hour in which they ended.
    Time not spent in steps (saves, stalls, restarts) is no part of throughput."""
    tokens = float(plan.config.tokens_per_step)
    durations = plan.step_duration
    if len(durations) == 0:
        return [None] * 24, 0.0
    rate = tokens / durations
    median = float(np.median(rate))
    hours = np.floor(plan.clock.local_hour(plan.step_end)).astype(np.int64) % 24
    step_count = np.bincount(hours, minlength=24)
    time_in = np.bincount(hours, weights=durations, minlength=24)
    deviation: list[float | None] = []
    for hour in range(24):
        if step_count[hour] == 0:
            deviation.append(None)
        else:
            deviation.append(round(100.0 * (tokens * step_count[hour] / time_in[hour] / median - 1.0), 4))
    present = [d for d in deviation if d is not None]
    return deviation, round(max(present) - min(present), 4) if present else 0.0


def cluster_level_w(plan: Plan, state: int, ts: float) -> float:
    """Expected cluster power (W) with every GPU in ``state`` at ``ts`` (no noise, no throttling)."""
    cycle = physics.day_cycle(plan.clock.local_hour(np.array([ts])), plan.config.peak_hour_local)
    states = np.full(plan.gpu_base_temp.shape, state)
    temp = physics.temperature_c(states, cycle[0], plan.gpu_base_temp, plan.config.temp_swing_c)
    power = physics.power_w(states, temp, plan.gpu_busy_power, plan.config.idle_power_w,
                            plan.config.base_temp_c)
    return float(power.sum())


_CAUSE_OF_EDGE = {
    (physics.BUSY, physics.CHECKPOINT): "checkpoint",
    (physics.CHECKPOINT, physics.BUSY): "checkpoint",
    (physics.BUSY, physics.STALL): "stall",
    (physics.STALL, physics.BUSY): "stall",
    (physics.CHECKPOINT, physics.STALL): "stall",
    (physics.BUSY, physics.HANG): "interruption",
    (physics.CHECKPOINT, physics.HANG): "interruption",
    (physics.STARTUP, physics.BUSY): "restart",
    (physics.STARTUP, physics.STALL): "restart",
}


def power_swings(plan: Plan) -> list[dict[str, Any]]:
    """Every change of the job's state that moves cluster power, with its size and cause.

    Cluster power is the sum over GPUs of each one's latest sample. A change reaches every GPU's
    samples within one sample interval, so a swing runs from the edge to one interval after it.
    Only changes the samples can show are listed: both levels held for two sample intervals at
    least, and none across the downtime after an interruption (nobody samples then: a gap, not
    a level)."""
    swings = []
    interval = plan.config.sample_interval_s
    starts = plan.seg_start.tolist()
    states = plan.seg_state.tolist()
    ends = starts[1:] + [plan.end]
    previous = None
    previous_span = 0.0
    for start, end, state in zip(starts, ends, states, strict=True):
        span = min(end, plan.end) - start
        if state == physics.DOWN:
            previous = None
            continue
        cause = _CAUSE_OF_EDGE.get((previous, state)) if previous is not None else None
        if cause is not None and previous_span >= 2 * interval and span >= 2 * interval:
            delta = cluster_level_w(plan, state, start) - cluster_level_w(plan, previous, start)
            swings.append({
                "start": _iso(start),
                "end": _iso(start + interval),
                "delta_kw": round(delta / 1000.0, 3),
                "cause": cause,
            })
        previous, previous_span = state, span
    swings.sort(key=lambda swing: -abs(swing["delta_kw"]))
    return swings


def ettr(plan: Plan) -> tuple[float, dict[str, float]]:
    """Productive time (the job's time in steps whose progress was kept) over the wall clock from
    the first start to the last step. Self-recovering stalls are badput here; the goodput
    analysis cannot tell them from a slow step, which the tests' tolerance allows for."""
    wall = plan.end - plan.start
    productive = float(plan.step_interval[plan.step_kept].sum())
    stalled = float(sum(duration for _, duration in plan.stalls))
    saves = float(sum(c.duration_s for c in plan.checkpoints if c.kind == "save"))
    lost = float(plan.step_interval[~plan.step_kept].sum())
    return (productive / wall if wall > 0 else 1.0), {
        "wall_s": round(wall, 3), "productive_s": round(productive, 3),
        "stall_s": round(stalled, 3), "checkpoint_save_s": round(saves, 3),
        "lost_steps_s": round(lost, 3)}


def ground_truth(plan: Plan, run_id: int, rows: dict[str, int] | None = None) -> GroundTruth:
    config = plan.config
    deviation, amplitude = hourly_throughput(plan)
    categories = Counter(i.category for i in plan.interruptions)
    ettr_value, ettr_parts = ettr(plan)
    saves = [c for c in plan.checkpoints if c.kind == "save"]
    return GroundTruth(
        run_id=run_id,
        run_name=config.run_name,
        project=config.project,
        gpus=config.world_size,
        hosts=plan.hosts,
        start=datetime.fromtimestamp(plan.start, tz=UTC),
        end=datetime.fromtimestamp(plan.end, tz=UTC),
        site_timezone=config.site_timezone,
        diurnal_amplitude_pct=amplitude,
        hourly_deviation_pct=deviation,
        swings=power_swings(plan),
        interruptions=dict(sorted(categories.items())),
        unexpected_interruptions=sum(n for c, n in categories.items()
                                     if c not in EXPECTED_CATEGORIES),
        ettr=round(ettr_value, 6),
        stragglers=[{"rank": rank, "host": plan.host_name(rank // GPUS_PER_HOST),
                     "gpu": rank % GPUS_PER_HOST, "slowdown": round(slowdown, 4)}
                    for rank, slowdown in sorted(plan.stragglers.items(), key=lambda kv: -kv[1])],
        hot_gpus=[{"host": plan.host_name(host), "gpu": gpu, "extra_c": config.hot_extra_c,
                   "throttling": throttles}
                  for (host, gpu), throttles in sorted(plan.hot.items())],
        details={
            "attempts": len(plan.attempts),
            "steps": int(plan.step_no.max()) if len(plan.step_no) else 0,
            "step_rows_per_rank": len(plan.step_no),
            "step_ranks": plan.step_ranks,
            "checkpoints": len(saves),
            "checkpoint_steps": [c.step for c in saves],
            "checkpoint_every_steps": config.checkpoint_every_steps,
            "stalls": [{"start": _iso(start), "duration_s": duration}
                       for start, duration in plan.stalls],
            "interruption_list": [
                {"ts": _iso(i.ts), "failed_at": _iso(i.failed_at), "category": i.category,
                 "expected": i.category in EXPECTED_CATEGORIES, "attempt": i.attempt,
                 "host": plan.host_name(i.host), "gpu": i.gpu, "rank": i.rank,
                 "resumed_from_step": i.saved_step, "last_step": i.last_step}
                for i in plan.interruptions],
            "ettr_parts": ettr_parts,
            "sample_interval_s": config.sample_interval_s,
            "diurnal_slowdown_pct": config.diurnal_slowdown_pct,
            "rows_sent": rows or {},
        },
    )


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat()
