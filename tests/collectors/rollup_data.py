"""Batches and expected rollups for tests/collectors/test_rollups.py and its embedded (SQLite) child
process: the expected rollups are computed here in Python from the stored raw rows, independently
of collectors.rollups."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from collectors.models import (
    ClusterMinute,
    GpuHour,
    GpuMinute,
    GpuSample,
    HostMinute,
    Run,
    StepMetric,
    StepMinute,
    StepQuarter,
)
from collectors.rollups import THROTTLING_MASK
from trainer_plugin import protocol

# 2026-12-03 10:00:00 UTC: minute boundaries fall on multiples of 60 from here.
T0 = 1_796_292_000.0
STEP_NUMBERS = ("steps", "last_step", "duration_n", "duration_max", "tokens", "loss_n")
STEP_SUMS = ("duration_sum", "loss_sum")
GPU_NUMBERS = ("samples", "temp_n", "temp_max", "power_n", "power_min", "power_max", "util_n",
               "clock_n", "clock_min", "throttled", "throttle_bits")
GPU_SUMS = ("temp_sum", "power_sum", "util_sum", "clock_sum")


def batch(*, rank: int, host: str, attempt: int = 0, run: str = "run-1", steps=(), gpus=(),
          world_size: int = 16) -> dict:
    """``steps``: (step, ts, duration, tokens, loss, accuracy); ``gpus``: (ts, gpu, temp, power,
    util, clock, throttle). None anywhere is a null on the wire."""
    step_table = {"step": [], "ts": [], "duration_s": [], "tokens": [],
                  "metrics": {"loss": [], "accuracy": []}}
    for step, ts, duration, tokens, loss, accuracy in steps:
        for column, value in (("step", step), ("ts", ts), ("duration_s", duration),
                              ("tokens", tokens)):
            step_table[column].append(value)
        step_table["metrics"]["loss"].append(loss)
        step_table["metrics"]["accuracy"].append(accuracy)
    gpu_table = protocol.empty_gpus()
    for ts, gpu, temp, power, util, clock, throttle in gpus:
        for column, value in (("ts", ts), ("gpu", gpu), ("temp_c", temp), ("power_w", power),
                              ("util_pct", util), ("mem_used_mb", 1000.0),
                              ("sm_clock_mhz", clock), ("throttle", throttle)):
            gpu_table[column].append(value)
    return protocol.make_batch(
        run={"project": "llm", "name": run, "attempt": attempt},
        source={"host": host, "rank": rank, "local_rank": rank % 8, "world_size": world_size},
        steps=step_table, gpus=gpu_table)


def maybe(rng: random.Random, value, chance: float = 0.15):
    return None if rng.random() < chance else value


def random_batches(rng: random.Random, run: str = "run-1", t0: float = T0) -> list[dict]:
    """Four ranks on two hosts (one with a non-ASCII name), each sending eight batches of steps and
    GPU samples that straddle minute boundaries, with nulls sprinkled through every column."""
    batches = []
    for rank in range(4):
        host = ("node-ö1", "node2")[rank // 2]
        for part in range(8):
            start = t0 + part * 37.3 + rank * 0.25
            steps = [(part * 50 + i, start + i * 0.71, maybe(rng, rng.uniform(0.5, 0.9)),
                      maybe(rng, 4096 + rank), maybe(rng, rng.uniform(1.0, 3.0)),
                      maybe(rng, rng.random())) for i in range(50)]
            gpus = []
            if rank % 2 == 0:  # one sampler per host, for that host's GPUs
                gpus = [(start + i * 0.5, i % 4, maybe(rng, rng.uniform(40, 85)),
                         maybe(rng, rng.uniform(100, 700)), maybe(rng, float(rng.randint(0, 100))),
                         maybe(rng, rng.uniform(1000, 2000)),
                         maybe(rng, rng.choice([0, 0, 0, 1, 4, 64, 1 << 40])))
                        for i in range(80)]
            batches.append(batch(rank=rank, host=host, run=run, steps=steps, gpus=gpus))
    return batches


def across_the_hour_batches(rng: random.Random) -> list[dict]:
    """run-1's random batches and run-h's, which starts 2.5 min before 10:00 UTC so that its
    batches straddle an hour as well as minutes."""
    return random_batches(rng) + random_batches(rng, run="run-h", t0=T0 - 150)


def with_redeliveries(rng: random.Random, batches: list[dict]) -> list[dict]:
    """``batches`` shuffled (out of order), with a third of them delivered twice."""
    deliveries = batches + rng.sample(batches, len(batches) // 3)
    rng.shuffle(deliveries)
    return deliveries


def step_aggregates(run: Run) -> dict:
    """StepMinute as it should be, computed here in Python from the stored raw rows."""
    found: dict = defaultdict(lambda: {"steps": 0, "last_step": None, "duration_n": 0,
                                       "duration_sum": 0.0, "duration_max": None, "tokens": 0,
                                       "loss_n": 0, "loss_sum": 0.0})
    for row in StepMetric.objects.filter(run=run):
        agg = found[(row.rank, row.ts.replace(second=0, microsecond=0))]
        agg["steps"] += 1
        agg["last_step"] = max(agg["last_step"] or row.step, row.step)
        if row.duration_s is not None:
            agg["duration_n"] += 1
            agg["duration_sum"] += row.duration_s
            agg["duration_max"] = max(agg["duration_max"] or 0.0, row.duration_s)
        agg["tokens"] += row.tokens or 0
        if row.loss is not None:
            agg["loss_n"] += 1
            agg["loss_sum"] += row.loss
    return dict(found)


def gpu_aggregates(run: Run) -> dict:
    found: dict = defaultdict(lambda: {
        "samples": 0, "temp_n": 0, "temp_sum": 0.0, "temp_max": None, "power_n": 0,
        "power_sum": 0.0, "power_min": None, "power_max": None, "util_n": 0, "util_sum": 0.0,
        "clock_n": 0, "clock_sum": 0.0, "clock_min": None, "throttled": 0, "throttle_bits": 0})
    for row in GpuSample.objects.filter(run=run):
        agg = found[(row.host, row.gpu, row.ts.replace(second=0, microsecond=0))]
        agg["samples"] += 1
        for value, prefix in ((row.temp_c, "temp"), (row.power_w, "power"),
                              (row.util_pct, "util"), (row.sm_clock_mhz, "clock")):
            if value is None:
                continue
            agg[f"{prefix}_n"] += 1
            agg[f"{prefix}_sum"] += value
            if f"{prefix}_max" in agg:
                agg[f"{prefix}_max"] = value if agg[f"{prefix}_max"] is None else max(
                    agg[f"{prefix}_max"], value)
            if f"{prefix}_min" in agg:
                agg[f"{prefix}_min"] = value if agg[f"{prefix}_min"] is None else min(
                    agg[f"{prefix}_min"], value)
        if row.throttle:
            # Idle, app clocks and the like are set on healthy GPUs: not throttling.
            agg["throttled"] += bool(row.throttle & THROTTLING_MASK)
            agg["throttle_bits"] |= row.throttle
    return dict(found)


HOST_NUMBERS = ("gpus", "power_samples", "temp_n")
HOST_SUMS = ("power_mean_sum", "power_min_sum", "power_max_sum", "temp_sum")


def host_aggregates(run: Run) -> dict:
    """HostMinute as it should be, from the raw rows: per (host, minute), the GPUs with a power
    sample, their samples, Σ of each one's mean/min/max power, and temperature over all GPUs."""
    per_gpu = gpu_aggregates(run)
    found: dict = defaultdict(lambda: {"gpus": 0, "power_samples": 0, "power_mean_sum": 0.0,
                                       "power_min_sum": 0.0, "power_max_sum": 0.0, "temp_n": 0,
                                       "temp_sum": 0.0})
    for (host, _, minute), agg in per_gpu.items():
        totals = found[(host, minute)]
        if agg["power_n"]:
            totals["gpus"] += 1
            totals["power_samples"] += agg["samples"]
            totals["power_mean_sum"] += agg["power_sum"] / agg["power_n"]
            totals["power_min_sum"] += agg["power_min"]
            totals["power_max_sum"] += agg["power_max"]
        totals["temp_n"] += agg["temp_n"]
        totals["temp_sum"] += agg["temp_sum"]
    return dict(found)


def cluster_aggregates(run: Run) -> dict:
    """ClusterMinute as it should be: host_aggregates' rows summed per minute over the hosts."""
    found: dict = {}
    for (_, minute), agg in host_aggregates(run).items():
        totals = found.setdefault(minute, dict.fromkeys(agg, 0))
        for name, value in agg.items():
            totals[name] += value
    return found


def hour_aggregates(run: Run) -> dict:
    """GpuHour as it should be: gpu_aggregates' per-minute sums merged per (host, gpu, hour)."""
    found: dict = {}
    for (host, gpu, minute), agg in gpu_aggregates(run).items():
        key = (host, gpu, minute.replace(minute=0))
        if key not in found:
            found[key] = dict(agg)
            continue
        totals = found[key]
        for name, value in agg.items():
            if name == "throttle_bits":
                totals[name] |= value
            elif name.endswith(("_max", "_min")):
                pick = max if name.endswith("_max") else min
                totals[name] = value if totals[name] is None else (
                    totals[name] if value is None else pick(totals[name], value))
            else:
                totals[name] += value
    return found


QUARTER_NUMBERS = ("minutes", "steps", "last_step", "duration_n", "tokens", "loss_n",
                   "loss_low_step", "loss_high_step", "slowest_low_step", "slowest_high_step",
                   "token_rate_low_at", "token_rate_high_at", "step_rate_low_at",
                   "step_rate_high_at")
QUARTER_SUMS = ("duration_sum", "loss_sum", "loss_low", "loss_high", "slowest_low",
                "slowest_high", "token_rate_low", "token_rate_high", "step_rate_low",
                "step_rate_high")


def quarter_aggregates(run: Run) -> dict:
    """StepQuarter as it should be: step_aggregates' minutes merged per (rank, quarter hour),
    with each chart's lowest and highest minute value (mean loss, slowest step, tokens/s and
    steps/s over the time the minute's steps took) and where it is drawn (the minute's last step
    or start); ties keep the earliest low and the latest high."""
    found: dict = {}
    for (rank, minute), agg in sorted(step_aggregates(run).items()):
        key = (rank, minute.replace(minute=minute.minute - minute.minute % 15))
        q = found.setdefault(key, {"minutes": 0, "steps": 0, "last_step": None, "duration_n": 0,
                                   "duration_sum": 0.0, "tokens": 0, "loss_n": 0,
                                   "loss_sum": 0.0})
        q["minutes"] += 1
        for name in ("steps", "duration_n", "duration_sum", "tokens", "loss_n", "loss_sum"):
            q[name] += agg[name]
        q["last_step"] = max(q["last_step"] or agg["last_step"], agg["last_step"])
        timed = agg["duration_n"] > 0 and agg["duration_sum"] > 0
        for name, value, x_name, x in (
                ("loss", agg["loss_sum"] / agg["loss_n"] if agg["loss_n"] else None, "step",
                 agg["last_step"]),
                ("slowest", agg["duration_max"], "step", agg["last_step"]),
                ("token_rate", agg["tokens"] / agg["duration_sum"]
                 if timed and agg["tokens"] > 0 else None, "at", minute),
                ("step_rate", agg["duration_n"] / agg["duration_sum"] if timed else None, "at",
                 minute)):
            q.setdefault(f"{name}_low", None)
            q.setdefault(f"{name}_high", None)
            q.setdefault(f"{name}_low_{x_name}", None)
            q.setdefault(f"{name}_high_{x_name}", None)
            if value is None:
                continue
            if q[f"{name}_low"] is None or value < q[f"{name}_low"]:
                q[f"{name}_low"], q[f"{name}_low_{x_name}"] = value, x
            if q[f"{name}_high"] is None or value >= q[f"{name}_high"]:
                q[f"{name}_high"], q[f"{name}_high_{x_name}"] = value, x
    return found


def stored_quarters(run: Run) -> dict:
    return {(r.rank, r.quarter): {f: getattr(r, f) for f in QUARTER_NUMBERS + QUARTER_SUMS}
            for r in StepQuarter.objects.filter(run=run)}


def stored_hosts(run: Run) -> dict:
    return {(r.host, r.minute): {f: getattr(r, f) for f in HOST_NUMBERS + HOST_SUMS}
            for r in HostMinute.objects.filter(run=run)}


def stored_clusters(run: Run) -> dict:
    return {r.minute: {f: getattr(r, f) for f in HOST_NUMBERS + HOST_SUMS}
            for r in ClusterMinute.objects.filter(run=run)}


def stored_hours(run: Run) -> dict:
    return {(r.host, r.gpu, r.hour): {f: getattr(r, f) for f in GPU_NUMBERS + GPU_SUMS}
            for r in GpuHour.objects.filter(run=run)}


def stored_steps(run: Run) -> dict:
    return {(r.rank, r.minute): {f: getattr(r, f) for f in STEP_NUMBERS + STEP_SUMS}
            for r in StepMinute.objects.filter(run=run)}


def stored_gpus(run: Run) -> dict:
    return {(r.host, r.gpu, r.minute): {f: getattr(r, f) for f in GPU_NUMBERS + GPU_SUMS}
            for r in GpuMinute.objects.filter(run=run)}


def assert_same(stored: dict, expected: dict, exact: tuple[str, ...], sums: tuple[str, ...]):
    """Counts, minima, maxima and bits exactly; float sums to the last few bits (the order of
    additions differs between a batch-at-a-time merge and one GROUP BY)."""
    assert stored.keys() == expected.keys()
    for key, row in expected.items():
        assert {f: stored[key][f] for f in exact} == {f: row[f] for f in exact}, key
        for field in sums:
            assert stored[key][field] == pytest.approx(row[field], rel=1e-12, abs=1e-9), \
                (key, field)


def expected_rollups(run: Run) -> dict:
    """Every rollup table's rows of ``run`` as they should be, from its raw rows."""
    return {"steps": step_aggregates(run), "gpus": gpu_aggregates(run),
            "hosts": host_aggregates(run), "clusters": cluster_aggregates(run),
            "hours": hour_aggregates(run), "quarters": quarter_aggregates(run)}


def assert_rollups(run: Run, expected: dict) -> None:
    """The stored StepMinute, GpuMinute, HostMinute, ClusterMinute, GpuHour and StepQuarter rows
    of ``run`` are ``expected`` (an ``expected_rollups`` of it)."""
    assert_same(stored_steps(run), expected["steps"], STEP_NUMBERS, STEP_SUMS)
    assert_same(stored_gpus(run), expected["gpus"], GPU_NUMBERS, GPU_SUMS)
    assert_same(stored_hosts(run), expected["hosts"], HOST_NUMBERS, HOST_SUMS)
    assert_same(stored_clusters(run), expected["clusters"], HOST_NUMBERS, HOST_SUMS)
    assert_same(stored_hours(run), expected["hours"], GPU_NUMBERS, GPU_SUMS)
    assert_same(stored_quarters(run), expected["quarters"], QUARTER_NUMBERS, QUARTER_SUMS)
