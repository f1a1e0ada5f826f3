"""The simulator without a database: determinism, the wire format, the evidence it plants."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from collectors.classification.engine import classify
from collectors.classification.rules import rules_from_file
from collectors.interruptions import _text
from collectors.simulation import SimConfig
from collectors.simulation import evidence as evidence_catalogue
from collectors.simulation.batches import BatchMaker
from collectors.simulation.config import LLAMA3_MIX
from collectors.simulation.plan import build_plan
from collectors.simulation.run import _windows
from collectors.simulation.truth import ground_truth, hourly_throughput
from trainer_plugin import protocol

START = datetime(2026, 7, 1, tzinfo=UTC)


def small(**overrides) -> SimConfig:
    values = {"run_name": "plan-test", "gpus": 16, "days": 0.5, "seed": 7, "start": START,
              "interruptions": 4}
    values.update(overrides)
    return SimConfig(**values)


def all_batches(config: SimConfig) -> list[dict]:
    plan = build_plan(config, config.resolved_start().timestamp())
    maker = BatchMaker(plan)
    windows = _windows(plan.start, plan.end, config.flush_interval_s, None)
    return [batch for i, (w0, w1) in enumerate(windows) for batch in maker.window(w0, w1, i)]


def test_same_seed_gives_the_same_batches_and_truth():
    first, second = all_batches(small()), all_batches(small())
    assert first == second
    plan_a = build_plan(small(), START.timestamp())
    plan_b = build_plan(small(), START.timestamp())
    assert ground_truth(plan_a, 1).as_dict() == ground_truth(plan_b, 1).as_dict()


def test_another_seed_gives_another_run():
    a = build_plan(small(seed=1), START.timestamp())
    b = build_plan(small(seed=2), START.timestamp())
    assert not np.array_equal(a.step_end[:100], b.step_end[:100])
    assert {b_["batch_id"] for b_ in all_batches(small(seed=1))}.isdisjoint(
        b_["batch_id"] for b_ in all_batches(small(seed=2)))


def test_every_batch_is_valid_wire_format_and_fits_the_limits():
    batches = all_batches(small())
    assert batches
    for batch in batches:
        protocol.validate_batch(batch)
        assert protocol.row_count(batch) <= protocol.MAX_ROWS
        assert batch["gpus"]["simulated"] is True or not batch["gpus"]["ts"]


def test_rows_cover_every_step_rank_and_gpu():
    config = small(interruptions=0, stalls=0)
    batches = all_batches(config)
    plan = build_plan(config, START.timestamp())
    steps_per_rank: dict[int, int] = {}
    gpus = set()
    for batch in batches:
        rank = batch["source"]["rank"]
        steps_per_rank[rank] = steps_per_rank.get(rank, 0) + len(batch["steps"]["step"])
        gpus.update((batch["source"]["host"], g) for g in batch["gpus"]["gpu"])
    assert set(steps_per_rank) == set(range(16))  # 16 GPUs: every rank reports steps
    assert set(steps_per_rank.values()) == {len(plan.step_no)}
    assert len(gpus) == 16


def test_large_clusters_report_steps_from_one_rank_per_host_and_the_stragglers():
    for seed in range(20):
        plan = build_plan(SimConfig(gpus=512, days=0.01, seed=seed, start=START),
                          START.timestamp())
        healthy = sorted(set(plan.step_ranks) - set(plan.stragglers))
        assert [rank // 8 for rank in healthy] == list(range(64))  # one per host
        assert set(plan.stragglers) <= set(plan.step_ranks)


def test_mid_sized_clusters_still_report_steps_from_16_healthy_ranks():
    plan = build_plan(SimConfig(gpus=32, days=0.01, seed=3, stragglers=3, start=START),
                      START.timestamp())
    healthy = set(plan.step_ranks) - set(plan.stragglers)
    assert len(healthy) == 16
    assert {rank // 8 for rank in healthy} == {0, 1, 2, 3}  # spread over every host
    assert set(plan.stragglers) <= set(plan.step_ranks)


def test_checkpoints_are_saved_every_k_steps():
    plan = build_plan(small(checkpoint_every_steps=200, interruptions=0), START.timestamp())
    saves = [c.step for c in plan.checkpoints if c.kind == "save"]
    assert saves == list(range(200, int(plan.step_no.max()) + 1, 200))


def test_a_restart_resumes_from_the_last_save():
    plan = build_plan(small(interruptions=3), START.timestamp())
    assert len(plan.attempts) == 4
    for interruption, following in zip(plan.interruptions, plan.attempts[1:], strict=True):
        first_step = plan.step_no[plan.step_attempt == following.number][0]
        assert first_step == interruption.saved_step + 1
        assert following.start == pytest.approx(interruption.ts + plan.config.restart_downtime_s)


def test_planted_diurnal_amplitude_follows_the_configured_slowdown():
    # tokens/s = 1 / step time: a 1.5% step-time swing is a 1 - 1/1.015 = 1.478% throughput swing.
    plan = build_plan(small(days=2, interruptions=0, stalls=0), START.timestamp())
    _, amplitude = hourly_throughput(plan)
    assert amplitude == pytest.approx(100 * (1 - 1 / 1.015), abs=0.05)
    flat = build_plan(small(days=2, interruptions=0, diurnal_slowdown_pct=0.0), START.timestamp())
    assert hourly_throughput(flat)[1] < 0.1  # only the steps' own jitter is left


def test_the_slowest_hour_is_the_configured_local_peak():
    plan = build_plan(small(days=2, interruptions=0, stalls=0, peak_hour_local=15.0),
                      START.timestamp())
    deviation, _ = hourly_throughput(plan)
    assert int(np.nanargmin(np.array(deviation, dtype=float))) in (14, 15)


def test_interruption_count_follows_the_llama3_rate():
    # 419 / (54 days × 16,384 GPUs) per GPU-day: 16,384 GPUs see ~7.76 a day.
    counts = [len(build_plan(SimConfig(gpus=16_384, days=1, seed=s, start=START, step_time_s=60,
                                       interruptions=None), START.timestamp()).interruptions)
              for s in range(12)]
    assert 5 <= np.mean(counts) <= 11


@pytest.mark.parametrize("category", sorted(set(LLAMA3_MIX) | {"planned"}))
def test_every_evidence_variant_is_classified_as_its_category(category):
    rules = rules_from_file()
    options = evidence_catalogue.variants(category, host="node003", gpu=5, rank=29,
                                          peer="10.0.4.22")
    for failure in options:
        event = {"kind": "interruption", "ts": 0.0, **failure.fields}
        evidence = {"text": _text(event), "exc_type": event.get("exc_type") or "",
                    "exit_code": event.get("exit_code"), "signal": event.get("signal"),
                    "xids": [failure.xid] if failure.xid else [],
                    "ecc_dbe": 1 if failure.ecc_dbe else None, "source": event["source"]}
        verdict = classify(evidence, rules=rules)
        assert verdict.category == category, (failure.fields, verdict)
        assert verdict.expected == (category in evidence_catalogue.EXPECTED_CATEGORIES)
