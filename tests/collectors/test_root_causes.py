"""Root-cause grouping: counts, share of unexpected interruptions, time lost; the label wins."""

from __future__ import annotations

import pytest

from collectors import reliability
from collectors.analysis.goodput import AttemptSpan, InterruptionFact, run_goodput
from collectors.analysis.root_causes import (
    COMPONENTS,
    component_of,
    interruption_costs,
    root_cause_table,
)
from collectors.models import Category, Interruption
from tests.generated_run import generate_run


def test_every_category_has_a_component():
    assert set(COMPONENTS) == set(Category.values)
    assert component_of("gpu_memory") == "GPU"
    assert component_of("nccl_timeout") == "Network"
    assert component_of("not-a-category") == "Unknown"


def test_table_counts_one_per_attempt_and_shares_of_unexpected():
    facts = [
        InterruptionFact(0, 10.0, "exception", "gpu_hardware", False, 1),
        InterruptionFact(0, 10.5, "exception", "gpu_hardware", False, 2),  # same crash, rank 2
        InterruptionFact(1, 20.0, "exception", "gpu_hardware", False, 3),
        InterruptionFact(2, 30.0, "kill", "host", False, 4),
        InterruptionFact(3, 40.0, "signal", "planned", True, 5),
    ]
    table = root_cause_table(facts, {0: 100.0, 1: 50.0, 2: 25.0, 3: 10.0})
    assert (table.total, table.unexpected, table.time_lost_s) == (4, 3, 185.0)
    rows = {r.category: r for r in table.rows}
    assert table.rows[0].category == "gpu_hardware"
    assert (rows["gpu_hardware"].count, rows["gpu_hardware"].time_lost_s) == (2, 150.0)
    assert rows["gpu_hardware"].pct_of_unexpected == pytest.approx(200 / 3)
    assert rows["host"].pct_of_unexpected == pytest.approx(100 / 3)
    assert rows["planned"].pct_of_unexpected == 0.0
    assert rows["planned"].component == "Planned"
    assert rows["gpu_hardware"].label == "GPU hardware"


def test_cost_of_an_interruption_is_lost_progress_stall_downtime_and_the_next_startup():
    spans = [AttemptSpan(0, 0.0, 10.0, 100.0, 1, 46), AttemptSpan(1, 200.0, 220.0, 240.0, 41, 51)]
    goodput = run_goodput(spans, [], [InterruptionFact(0, 101.0, "exception")], {0: 88.0})
    # 12 s redone + 1 s crashed step + 99 s down + 20 s startup
    assert interruption_costs(goodput) == {0: pytest.approx(132.0)}


def test_generated_run_table_uses_the_label_when_there_is_one(token, django_user_model):
    generated = generate_run(token)
    run = generated.run
    table = root_cause_table(reliability.interruption_facts(reliability.run_interruptions(run)))
    assert sorted((r.category, r.count) for r in table.rows) == [
        ("gpu_hardware", 1), ("host", 1), ("nccl_timeout", 1)]

    hang = Interruption.objects.get(run=run, source="stall")
    hang.label_category, hang.label_expected = Category.HOST_MAINTENANCE, True
    hang.save()
    goodput = reliability.run_goodput(run)
    table = root_cause_table(reliability.interruption_facts(reliability.run_interruptions(run)),
                             interruption_costs(goodput))
    rows = {r.category: r for r in table.rows}
    assert "nccl_timeout" not in rows
    assert rows["host_maintenance"].unexpected == 0
    assert table.unexpected == 2
    assert rows["host"].pct_of_unexpected == 50.0
    truth = generated.truth
    # Every second of badput except the first attempt's startup and the saves is some
    # interruption's cost.
    booked = truth.lost_progress + truth.stall + truth.restart_downtime + truth.startup \
        - generated.plan[0].startup_s
    assert table.time_lost_s == pytest.approx(booked, abs=0.05)
    assert goodput.unexpected_interruptions == 2
