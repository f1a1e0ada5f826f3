"""Day partitions of the step and GPU-sample tables (migration 0006, collectors.partitions), against
the real PostgreSQL: rows land in their day, nothing is refused or lost, concurrent workers can
create the same day, retention drops only old days, and the ORM reads and deletes as before."""

from __future__ import annotations

import copy
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections

from collectors import partitions
from collectors.models import Attempt, GpuSample, Project, Run, StepMetric
from collectors.tasks import ensure_partitions, ingest_batch
from tests.batches import step_batch

STEPS, GPUS = partitions.TABLES


def _where(table: str, run: Run) -> dict[str, int]:
    """Rows of ``run`` per partition name."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT tableoid::regclass::text, count(*) FROM {table} "
                       f"WHERE run_id = %s GROUP BY 1", [run.pk])
        return dict(cursor.fetchall())


def _exists(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
        return cursor.fetchone()[0]


@pytest.fixture(autouse=True)
def _fresh_cache():
    # Each test starts from what the database says, not what an earlier test's process cached.
    partitions.forget()
    yield
    partitions.forget()


def _run_with_attempt(name: str = "run-1") -> tuple[Run, Attempt]:
    project, _ = Project.objects.get_or_create(slug="llm")
    run = Run.objects.create(project=project, name=name)
    return run, Attempt.objects.create(run=run, number=0)


def _gpu_row(run: Run, attempt: Attempt, ts: datetime) -> GpuSample:
    return GpuSample(run=run, attempt=attempt, host="node000", gpu=0, ts=ts, temp_c=60.0)


@pytest.mark.django_db
def test_sample_tables_are_partitioned_by_ts_with_a_default_partition():
    with connection.cursor() as cursor:
        for table in partitions.TABLES:
            cursor.execute("""
                SELECT c.relkind, pg_get_partkeydef(c.oid),
                       (SELECT pg_get_constraintdef(k.oid) FROM pg_constraint k
                        WHERE k.conrelid = c.oid AND k.contype = 'p')
                FROM pg_class c WHERE c.oid = %s::regclass""", [table])
            assert cursor.fetchone() == ("p", "RANGE (ts)", "PRIMARY KEY (id, ts)")
            assert _exists(f"{table}_default")


def test_batch_rows_land_in_their_days_partition(token):
    t0 = datetime(2026, 3, 10, 23, 59, 55, tzinfo=UTC).timestamp()
    ingest_batch(step_batch(count=10, gpus=2, t0=t0), token=token)  # crosses midnight

    run = Run.objects.get()
    assert _where(STEPS, run) == {f"{STEPS}_p20260310": 5, f"{STEPS}_p20260311": 5}
    assert _where(GPUS, run) == {f"{GPUS}_p20260310": 2}
    assert StepMetric.objects.filter(run=run).count() == 10


@pytest.mark.parametrize("when", [datetime(1999, 7, 1, 12, tzinfo=UTC),
                                  datetime(2091, 1, 1, 12, tzinfo=UTC)])
def test_a_batch_far_in_the_past_or_future_is_stored_in_its_own_day(token, when):
    batch = step_batch(count=20, gpus=4, t0=when.timestamp())
    result = ingest_batch(copy.deepcopy(batch), token=token)

    assert result["stored"] is True
    run = Run.objects.get()
    day = f"p{when:%Y%m%d}"
    assert _where(STEPS, run) == {f"{STEPS}_{day}": 20}
    assert _where(GPUS, run) == {f"{GPUS}_{day}": 4}
    assert sorted(StepMetric.objects.filter(run=run).values_list("step", flat=True)) == list(
        range(20))


@pytest.mark.django_db
def test_rows_without_a_partition_wait_in_default_and_move_into_their_day_when_it_is_made():
    run, attempt = _run_with_attempt()
    day = datetime(2004, 2, 29, 6, tzinfo=UTC)
    # Written straight through the ORM, as no ingest path would: nothing made the partition.
    GpuSample.objects.bulk_create([_gpu_row(run, attempt, day + timedelta(minutes=i))
                                   for i in range(3)])
    assert _where(GPUS, run) == {f"{GPUS}_default": 3}

    created = partitions.ensure_range(day, day)

    assert f"{GPUS}_p20040229" in created
    assert _where(GPUS, run) == {f"{GPUS}_p20040229": 3}
    assert GpuSample.objects.filter(run=run, ts__gte=day).count() == 3


@pytest.mark.django_db
def test_ensuring_the_same_days_twice_creates_nothing_the_second_time():
    start = datetime(2005, 6, 1, tzinfo=UTC)
    first = partitions.ensure_range(start, start + timedelta(days=2))
    partitions.forget()
    second = partitions.ensure_range(start, start + timedelta(days=2))

    assert len(first) == 6  # 3 days x 2 tables
    assert second == []


@pytest.mark.django_db(transaction=True)
def test_concurrent_workers_ensuring_the_same_days_all_succeed():
    days = range(partitions.day_of(datetime(2006, 9, 1, tzinfo=UTC)),
                 partitions.day_of(datetime(2006, 9, 4, tzinfo=UTC)))
    barrier = threading.Barrier(6)
    created: list[list[str]] = []
    errors: list[BaseException] = []

    def worker():
        try:
            barrier.wait()
            created.append(partitions.ensure_days(days))
        except BaseException as error:  # noqa: BLE001 - the test reports any failure
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    names = sorted(name for found in created for name in found)
    assert names == sorted(partitions.partition_name(t, d) for t in partitions.TABLES for d in days)
    for table in partitions.TABLES:
        starts = [p.start for p in partitions.partitions(table)]
        assert len(starts) == len(set(starts))


@pytest.mark.django_db
def test_retention_drops_only_partitions_older_than_the_cutoff():
    run, attempt = _run_with_attempt()
    old, recent = datetime(2002, 3, 1, 12, tzinfo=UTC), datetime(2002, 3, 5, 12, tzinfo=UTC)
    partitions.ensure_range(old, old)
    partitions.ensure_range(recent, recent)
    GpuSample.objects.bulk_create([_gpu_row(run, attempt, old), _gpu_row(run, attempt, recent),
                                   _gpu_row(run, attempt, datetime(1990, 1, 1, tzinfo=UTC))])

    cutoff = datetime(2002, 3, 3, tzinfo=UTC)
    would = partitions.drop_older_than(cutoff, dry_run=True)
    assert {p.name for p in would} >= {f"{STEPS}_p20020301", f"{GPUS}_p20020301"}
    assert _exists(f"{GPUS}_p20020301")

    dropped = partitions.drop_older_than(cutoff)

    assert {p.name for p in dropped} == {p.name for p in would}
    assert all(p.end <= cutoff for p in dropped)
    assert not _exists(f"{GPUS}_p20020301")
    assert _exists(f"{GPUS}_p20020305") and _exists(f"{GPUS}_default")
    # The old day's rows went with it; the recent day's and the default partition's stayed.
    assert sorted(GpuSample.objects.filter(run=run).values_list("ts", flat=True)) == [
        datetime(1990, 1, 1, tzinfo=UTC), recent]


@pytest.mark.django_db
def test_prune_command_refuses_to_drop_today_and_lists_a_dry_run(capsys):
    with pytest.raises(CommandError, match="at least 1"):
        call_command("prune_partitions", "--keep-days", "0")
    partitions.ensure_range(datetime(2001, 1, 1, tzinfo=UTC), datetime(2001, 1, 1, tzinfo=UTC))

    call_command("prune_partitions", "--keep-days", "30", "--dry-run")

    out = capsys.readouterr().out
    assert f"would drop {GPUS}_p20010101 (2001-01-01)" in out
    assert _exists(f"{GPUS}_p20010101")


@pytest.mark.django_db
def test_beat_task_makes_today_and_the_days_ahead():
    ensure_partitions()

    today = partitions.day_of(datetime.now(UTC))
    for table in partitions.TABLES:
        days = {partitions.day_of(p.start) for p in partitions.partitions(table)}
        assert set(range(today, today + partitions.DAYS_AHEAD + 1)) <= days


@pytest.mark.django_db
def test_orm_reads_across_partitions_and_deleting_a_run_deletes_its_rows():
    run, attempt = _run_with_attempt()
    other, other_attempt = _run_with_attempt("run-2")
    start = datetime(2007, 5, 1, 22, tzinfo=UTC)
    partitions.ensure_range(start, start + timedelta(days=1))
    times = [start + timedelta(hours=h) for h in range(0, 60, 6)]  # 2 days + the default's
    StepMetric.objects.bulk_create(
        [StepMetric(run=r, attempt=a, rank=0, step=i, ts=t, loss=float(i))
         for r, a in ((run, attempt), (other, other_attempt)) for i, t in enumerate(times)])
    assert len(_where(STEPS, run)) == 3  # two days and the default partition

    window = StepMetric.objects.filter(run=run, ts__gte=times[2], ts__lt=times[6]).order_by("-ts")
    assert list(window.values_list("step", flat=True)) == [5, 4, 3, 2]
    assert StepMetric.objects.filter(run=run).order_by("ts").last().step == len(times) - 1

    run.delete()

    assert StepMetric.objects.filter(run_id=run.pk).count() == 0
    assert StepMetric.objects.filter(run=other).count() == len(times)


@pytest.mark.django_db(transaction=True)
def test_migration_keeps_the_rows_stored_before_it():
    call_command("migrate", "collectors", "0005", verbosity=0)
    try:
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO collectors_project (slug, name, created_at) "
                           "VALUES ('old', '', now()) RETURNING id")
            project = cursor.fetchone()[0]
            cursor.execute("INSERT INTO collectors_run (project_id, name, config, status, timezone, "
                           "world_size, created_at) VALUES (%s, 'r', '{}', 'running', 'UTC', 1, "
                           "now()) RETURNING id", [project])
            run = cursor.fetchone()[0]
            cursor.execute("INSERT INTO collectors_attempt (run_id, number, exit_reason) "
                           "VALUES (%s, 0, '') RETURNING id", [run])
            attempt = cursor.fetchone()[0]
            cursor.execute("""
                INSERT INTO collectors_stepmetric (run_id, attempt_id, rank, step, ts, loss, extra)
                SELECT %s, %s, 0, g, '2008-01-01'::timestamptz + g * interval '1 hour', g, '{}'
                FROM generate_series(1, 50) g""", [run, attempt])
            cursor.execute("SELECT max(id) FROM collectors_stepmetric")
            last_id = cursor.fetchone()[0]
    finally:
        call_command("migrate", "collectors", verbosity=0)

    rows = StepMetric.objects.filter(run_id=run).order_by("step")
    assert [(r.step, r.loss) for r in rows] == [(g, float(g)) for g in range(1, 51)]
    assert set(_where(STEPS, Run(pk=run))) == {f"{STEPS}_p2008010{d}" for d in (1, 2, 3)}
    # New rows keep numbering after the old ones.
    added = StepMetric.objects.create(run_id=run, attempt_id=attempt, rank=0, step=51,
                                      ts=datetime(2008, 1, 3, 12, tzinfo=UTC))
    assert added.pk > last_id
