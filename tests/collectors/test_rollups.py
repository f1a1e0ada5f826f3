"""Per-minute rollups kept by ingest (collectors.rollups) against the raw rows they summarise, and
`rebuild_rollups` against what ingest kept."""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from collectors import cluster_reads, rollups
from collectors.models import GpuHour, GpuMinute, GpuSample, HostMinute, Run, StepMetric, StepMinute
from collectors.tasks import ingest_batch
from tests.collectors.rollup_data import (
    GPU_NUMBERS,
    GPU_SUMS,
    HOST_NUMBERS,
    HOST_SUMS,
    STEP_NUMBERS,
    STEP_SUMS,
    T0,
    across_the_hour_batches,
    assert_same,
    batch,
    cluster_aggregates,
    gpu_aggregates,
    host_aggregates,
    hour_aggregates,
    quarter_aggregates,
    random_batches,
    step_aggregates,
    stored_clusters,
    stored_gpus,
    stored_hosts,
    stored_hours,
    stored_steps,
    with_redeliveries,
)


@pytest.fixture
def ingested(token):
    """The random batches, shuffled (out of order), with a third of them delivered twice."""
    rng = random.Random(7)
    batches = random_batches(rng)
    results = [ingest_batch(copy.deepcopy(b), token=token)
               for b in with_redeliveries(rng, batches)]
    assert sum(r["stored"] for r in results) == len(batches)
    return Run.objects.get(name="run-1")


def test_rollups_equal_the_aggregates_of_the_raw_rows(ingested):
    assert StepMetric.objects.filter(run=ingested).count() == 4 * 8 * 50
    assert GpuSample.objects.filter(run=ingested).count() == 2 * 8 * 80

    steps, gpus = step_aggregates(ingested), gpu_aggregates(ingested)
    assert_same(stored_steps(ingested), steps, STEP_NUMBERS, STEP_SUMS)
    assert_same(stored_gpus(ingested), gpus, GPU_NUMBERS, GPU_SUMS)
    # The data really exercises what it claims to: several minutes, hosts, nulls and throttling.
    assert len({minute for _, minute in steps}) == 5
    assert {host for host, _, _ in gpus} == {"node-ö1", "node2"}
    assert any(agg["loss_n"] < agg["steps"] for agg in steps.values())
    assert any(agg["temp_n"] < agg["samples"] for agg in gpus.values())
    assert any(agg["throttle_bits"] & (1 << 40) for agg in gpus.values())


@pytest.fixture
def across_the_hour(token):
    """Two runs' random batches, shuffled together with redeliveries: one run starting 2.5 min
    before 10:00 UTC so its batches straddle an hour as well as minutes."""
    rng = random.Random(23)
    batches = across_the_hour_batches(rng)
    assert sum(ingest_batch(copy.deepcopy(b), token=token)["stored"]
               for b in with_redeliveries(rng, batches)) == len(batches)
    return [Run.objects.get(name="run-1"), Run.objects.get(name="run-h")]


def test_host_minutes_and_gpu_hours_equal_the_aggregates_of_the_raw_rows(across_the_hour):
    for run in across_the_hour:
        assert_same(stored_hosts(run), host_aggregates(run), HOST_NUMBERS, HOST_SUMS)
        assert_same(stored_hours(run), hour_aggregates(run), GPU_NUMBERS, GPU_SUMS)
    hours = stored_hours(across_the_hour[1])
    # The data crosses 10:00 UTC on both hosts, with throttling.
    assert {(host, hour.hour) for host, _, hour in hours} == {
        (host, h) for host in ("node-ö1", "node2") for h in (9, 10)}
    assert any(row["throttled"] for row in hours.values())
    # Idle (0x1) samples are among them: counting them as throttled would break the equality.
    assert any(row["throttle_bits"] & 1 for row in hours.values())
    assert HostMinute.objects.filter(run=across_the_hour[1]).count() == len(
        host_aggregates(across_the_hour[1]))


def test_rebuild_reproduces_host_minutes_and_gpu_hours(across_the_hour):
    expected = [(stored_hosts(run), stored_hours(run)) for run in across_the_hour]
    HostMinute.objects.all().delete()
    GpuHour.objects.update(samples=0, throttled=99)  # wrong on purpose: rebuild replaces

    counts = rollups.rebuild()

    for run, (hosts, hours) in zip(across_the_hour, expected, strict=True):
        assert_same(stored_hosts(run), hosts, HOST_NUMBERS, HOST_SUMS)
        assert_same(stored_hours(run), hours, GPU_NUMBERS, GPU_SUMS)
    assert counts["host_minutes"] == sum(len(h) for h, _ in expected)
    assert counts["gpu_hours"] == sum(len(h) for _, h in expected)


def test_rebuild_reproduces_cluster_minutes(across_the_hour):
    from collectors.models import ClusterMinute

    expected = [stored_clusters(run) for run in across_the_hour]
    assert all(expected)
    ClusterMinute.objects.filter(run=across_the_hour[0]).delete()
    ClusterMinute.objects.filter(run=across_the_hour[1]).update(gpus=0, power_mean_sum=-1.0)

    counts = rollups.rebuild()

    for run, clusters in zip(across_the_hour, expected, strict=True):
        assert_same(stored_clusters(run), clusters, HOST_NUMBERS, HOST_SUMS)
        assert_same(clusters, cluster_aggregates(run), HOST_NUMBERS, HOST_SUMS)
    assert counts["cluster_minutes"] == sum(len(c) for c in expected)


def test_migration_fills_the_cluster_minutes_of_host_minutes_stored_before_it(across_the_hour):
    import importlib

    from django.db import connection

    from collectors.models import ClusterMinute

    expected = [stored_clusters(run) for run in across_the_hour]
    ClusterMinute.objects.all().delete()
    migration = importlib.import_module("collectors.migrations.0011_cluster_minute")

    with connection.cursor() as cursor:
        cursor.execute(migration.FILL_SQL)

    for run, clusters in zip(across_the_hour, expected, strict=True):
        assert_same(stored_clusters(run), clusters, HOST_NUMBERS, HOST_SUMS)


@pytest.mark.django_db(transaction=True)
def test_cluster_minute_counts_every_host_when_workers_store_one_minute_at_once(token):
    """Two workers store different hosts' samples of the same minutes at once. The second sums the
    minute's hosts only after the first committed (it waits for the first's row lock): summed as
    its statement began, its row would hold its own host alone and overwrite the first's."""
    import threading

    from django.db import connection, transaction

    from collectors.ingest import store_batch
    from collectors.models import Project
    from trainer_plugin.protocol import validate_batch

    project_id = Project.objects.get(slug="llm").pk

    def host_batch(host: str, rank: int, watts: float) -> dict:
        return validate_batch(batch(rank=rank, host=host, gpus=[
            (T0 + 50 + i, gpu, 60.0, watts + gpu, 90.0, 1500.0, 0)
            for i in range(20) for gpu in range(4)]))

    ingest_batch(batch(rank=0, host="node-a", gpus=[(T0, 0, 60.0, 100.0, 90.0, 1500.0, 0)]),
                 token=token)  # the run and attempt exist before the workers race
    holding, release = threading.Event(), threading.Event()

    def first_worker_held_open():
        try:
            with transaction.atomic():
                store_batch(host_batch("node-a", 0, 300.0), project_id)
                holding.set()
                release.wait(30)
        finally:
            connection.close()

    second_done = threading.Event()

    def second_worker():
        try:
            store_batch(host_batch("node-b", 8, 500.0), project_id)
            second_done.set()
        finally:
            connection.close()

    first = threading.Thread(target=first_worker_held_open)
    second = threading.Thread(target=second_worker)
    first.start()
    try:
        assert holding.wait(30)
        second.start()
        # It waits on the minute rows the first worker holds until it commits.
        assert not second_done.wait(1.0)
    finally:
        release.set()
        first.join(30)
        second.join(30)
    assert second_done.is_set()

    run = Run.objects.get(name="run-1")
    clusters = stored_clusters(run)
    assert_same(clusters, cluster_aggregates(run), HOST_NUMBERS, HOST_SUMS)
    assert [row["gpus"] for row in clusters.values()] == [8, 8]  # both hosts' 4 GPUs, 2 minutes


def test_cluster_reads_from_host_minutes_and_gpu_hours_equal_the_raw_aggregates(across_the_hour):
    run = across_the_hour[1]
    per_gpu = gpu_aggregates(run)
    # Power per minute: Σ over the GPUs with a power sample of their mean, min and max; their count.
    expected: dict[float, list] = {}
    for (_, _, minute), agg in per_gpu.items():
        if agg["power_n"]:
            e = expected.setdefault(minute.timestamp(), [0.0, 0.0, 0.0, 0, 0])
            e[0] += agg["power_sum"] / agg["power_n"]
            e[1] += agg["power_max"]
            e[2] += agg["power_min"]
            e[3] += 1
            e[4] += agg["samples"]
    rows = cluster_reads.minute_power(run)
    minutes = sorted(expected)
    i = [round((m - rows.minutes.series.start) / 60) for m in minutes]
    assert rows.minutes.series.start == minutes[0] and len(rows.samples) == len(minutes)
    assert rows.minutes.series.gpus[i].tolist() == [expected[m][3] for m in minutes]
    assert rows.samples[i].tolist() == [expected[m][4] for m in minutes]
    assert rows.minutes.upper[i] * 1000 == pytest.approx([expected[m][1] for m in minutes])
    assert rows.minutes.lower[i] * 1000 == pytest.approx([expected[m][2] for m in minutes])

    # GPU health's hourly cells (a whole-hour bucket reads GpuHour) against the raw samples.
    hours = hour_aggregates(run)
    cells = {(c.host, c.gpu, datetime.fromtimestamp(c.bucket, tz=UTC)): c
             for c in cluster_reads.gpu_cells(run, 3600)}
    assert cells.keys() == hours.keys()
    for key, agg in hours.items():
        c = cells[key]
        assert (c.samples, c.temp_n, c.temp_max, c.power_n, c.power_max, c.throttled,
                c.throttle_bits) == (agg["samples"], agg["temp_n"], agg["temp_max"],
                                     agg["power_n"], agg["power_max"], agg["throttled"],
                                     agg["throttle_bits"]), key
        assert (c.temp_sum, c.power_sum) == pytest.approx((agg["temp_sum"], agg["power_sum"]))
    # Days and multi-hour buckets are unions of hours, binned from the epoch.
    day = {(c.host, c.gpu, c.bucket): (c.samples, c.throttled)
           for c in cluster_reads.gpu_cells(run, 86_400)}
    expected_day: dict = {}
    for (host, gpu, hour), agg in hours.items():
        key = (host, gpu, hour.timestamp() // 86_400 * 86_400)
        samples, throttled = expected_day.get(key, (0, 0))
        expected_day[key] = (samples + agg["samples"], throttled + agg["throttled"])
    assert day == expected_day and len(day) == len(hours) // 2


def test_a_redelivered_batch_is_not_counted_twice(token):
    once = batch(rank=0, host="node0", steps=[(1, T0 + 1, 0.5, 10, 2.0, None)],
                 gpus=[(T0 + 1, 0, 50.0, 300.0, 90.0, 1500.0, 0)])
    for _ in range(3):
        ingest_batch(copy.deepcopy(once), token=token)

    assert StepMinute.objects.get().steps == 1
    assert StepMinute.objects.get().tokens == 10
    assert GpuMinute.objects.get().samples == 1
    assert GpuMinute.objects.get().power_sum == 300.0


def test_batches_of_one_minute_merge_sums_counts_minima_and_maxima(token):
    minute = datetime.fromtimestamp(T0, tz=UTC)
    ingest_batch(batch(rank=0, host="n", gpus=[(T0 + 1, 0, 50.0, 300.0, None, 1500.0, 2)]),
                 token=token)
    ingest_batch(batch(rank=0, host="n", gpus=[(T0 + 2, 0, 70.0, None, 80.0, 1400.0, 0),
                                                (T0 + 59.9, 0, None, 200.0, 60.0, None, 8)]),
                 token=token)

    row = GpuMinute.objects.get()
    # 0x2 (application clocks) is normal operation; 0x8 (hardware slowdown) is throttling.
    assert (row.minute, row.samples, row.throttled, row.throttle_bits) == (minute, 3, 1, 10)
    assert (row.temp_n, row.temp_sum, row.temp_max) == (2, 120.0, 70.0)
    assert (row.power_n, row.power_sum, row.power_min, row.power_max) == (2, 500.0, 200.0, 300.0)
    assert (row.util_n, row.util_sum, row.clock_n, row.clock_min) == (2, 140.0, 2, 1400.0)


def test_a_minute_with_only_nulls_keeps_null_extremes(token):
    ingest_batch(batch(rank=1, host="n", steps=[(5, T0 + 3, None, None, None, None)],
                       gpus=[(T0 + 3, 1, None, None, None, None, None)]), token=token)

    step = StepMinute.objects.get()
    assert (step.steps, step.last_step, step.duration_n, step.duration_max, step.tokens,
            step.loss_n) == (1, 5, 0, None, 0, 0)
    gpu = GpuMinute.objects.get()
    assert (gpu.samples, gpu.temp_n, gpu.temp_max, gpu.power_min, gpu.clock_min,
            gpu.throttled) == (1, 0, None, None, None, 0)


def test_a_step_is_filed_under_the_minute_of_its_stored_microsecond(token):
    # 59.9999996 s past the minute is stored as the next minute's first microsecond.
    ingest_batch(batch(rank=0, host="n", steps=[(1, T0 + 59.9999996, 1.0, 1, 1.0, None),
                                                 (2, T0 + 59.999999, 1.0, 1, 1.0, None)]),
                 token=token)

    stored = sorted(StepMetric.objects.values_list("step", "ts"))
    assert stored[0][1] == datetime(2026, 12, 3, 10, 1, tzinfo=UTC)
    assert stored[1][1] == datetime(2026, 12, 3, 10, 0, 59, 999999, tzinfo=UTC)
    assert sorted(StepMinute.objects.values_list("minute", "last_step")) == [
        (datetime(2026, 12, 3, 10, 0, tzinfo=UTC), 2),
        (datetime(2026, 12, 3, 10, 1, tzinfo=UTC), 1)]


def test_rebuild_reproduces_what_ingest_maintained(ingested, token):
    ingest_batch(batch(rank=0, host="other", run="run-2",
                       steps=[(1, T0, 1.0, 1, 1.0, None)]), token=token)
    other = Run.objects.get(name="run-2")
    steps, gpus = stored_steps(ingested), stored_gpus(ingested)
    other_steps = stored_steps(other)

    counts = rollups.rebuild()

    assert counts == {"step_minutes": len(steps) + 1, "gpu_minutes": len(gpus),
                      "host_minutes": len(host_aggregates(ingested)),
                      "gpu_hours": len(hour_aggregates(ingested)),
                      "cluster_minutes": len(cluster_aggregates(ingested)),
                      "step_quarters": len(quarter_aggregates(ingested)) + 1}
    assert_same(stored_steps(ingested), steps, STEP_NUMBERS, STEP_SUMS)
    assert_same(stored_gpus(ingested), gpus, GPU_NUMBERS, GPU_SUMS)
    assert stored_steps(other) == other_steps


def test_rebuild_rollups_command_fills_rollups_of_rows_loaded_without_ingest(ingested, capsys):
    steps, gpus = stored_steps(ingested), stored_gpus(ingested)
    # As after a bulk load by COPY: raw rows but no rollups.
    StepMinute.objects.all().delete()
    GpuMinute.objects.all().delete()

    call_command("rebuild_rollups", "--run", str(ingested.pk))

    assert_same(stored_steps(ingested), steps, STEP_NUMBERS, STEP_SUMS)
    assert_same(stored_gpus(ingested), gpus, GPU_NUMBERS, GPU_SUMS)
    assert f"rebuilt run {ingested.pk}: {len(steps):,} step minutes" in capsys.readouterr().out


def test_rebuild_of_one_run_leaves_the_others_alone(ingested, token):
    ingest_batch(batch(rank=0, host="other", run="run-2",
                       gpus=[(T0, 0, 1.0, 1.0, 1.0, 1.0, 0)]), token=token)
    other = Run.objects.get(name="run-2")
    GpuMinute.objects.filter(run=other).update(samples=99)  # wrong on purpose: must stay so

    rollups.rebuild(ingested.pk)

    assert GpuMinute.objects.get(run=other).samples == 99


def test_rebuild_rollups_names_a_run_that_does_not_exist(db):
    with pytest.raises(CommandError, match="no run with id 424242"):
        call_command("rebuild_rollups", "--run", "424242")


def test_embedded_mode_keeps_and_rebuilds_the_same_rollups(tmp_path):
    """SQLite: bulk_create instead of COPY, scalar MAX()/MIN() in the upsert, the portable
    rebuild. The child process asserts the rollups against the raw rows before and after
    rebuilding."""
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("CELERY_BROKER_URL",
                                                            "CELERY_TASK_ALWAYS_EAGER")}
    env.update(DATABASE_URL=f"sqlite:///{tmp_path / 'embedded.sqlite3'}", PYTHONPATH=str(root),
               DJANGO_SETTINGS_MODULE="dashboard.settings")
    child = subprocess.run([sys.executable, "-m", "tests.collectors.embedded_rollups"], cwd=root,
                           env=env, capture_output=True, text=True, timeout=180)
    assert child.returncode == 0, child.stderr[-4000:]
    seen = json.loads(child.stdout.strip().splitlines()[-1])

    assert seen["stored"] == seen["batches"] == 64
    assert seen["gpu_hours"] == {"run-1": [10], "run-h": [9, 10]}
    assert (seen["steps"], seen["gpu_samples"]) == (4 * 8 * 50, 2 * 8 * 80)
    assert seen["hosts"] == ["node-ö1", "node2"]
    assert seen["step_minutes"] > 0 and seen["gpu_minutes"] > 0
    assert seen["edge"] == ["2026-12-03T10:01:00+00:00", None, None, 1.5, {"accuracy": 0.25}]


def test_rebuild_files_rows_under_utc_minutes_whatever_the_session_zone(token):
    # Monrovia was 44 min 30 s behind UTC in 1970: its minutes start at :30 s of UTC's.
    ingest_batch(batch(rank=0, host="n", steps=[(1, 10.0, 1.0, 1, 1.0, None),
                                                 (2, 40.0, 1.0, 1, 1.0, None)]), token=token)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL TimeZone = 'Africa/Monrovia'")

    rollups.rebuild()

    assert list(StepMinute.objects.values_list("minute", "steps")) == [
        (datetime(1970, 1, 1, tzinfo=UTC), 2)]
