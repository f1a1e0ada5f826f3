"""Run as a child process by tests/collectors/test_rollups.py on SQLite (the embedded mode): ingests
the rollup test batches through the ingest task (bulk_create instead of COPY, SQLite's upsert) and
checks the rollups, then rebuilds them and checks again. Prints one JSON object on the last line;
any mismatch fails with an AssertionError. Not collected by pytest (the suite refuses SQLite)."""

from __future__ import annotations

import copy
import json
import random

import django


def main() -> None:
    django.setup()

    from django.conf import settings
    from django.core.management import call_command

    from collectors.models import GpuSample, IngestToken, Project, Run, StepMetric
    from collectors.tasks import ingest_batch
    from tests.collectors.rollup_data import (
        GPU_NUMBERS,
        GPU_SUMS,
        HOST_NUMBERS,
        HOST_SUMS,
        STEP_NUMBERS,
        STEP_SUMS,
        T0,
        assert_same,
        batch,
        gpu_aggregates,
        host_aggregates,
        hour_aggregates,
        random_batches,
        step_aggregates,
        stored_gpus,
        stored_hosts,
        stored_hours,
        stored_steps,
    )

    assert settings.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3"
    call_command("migrate", verbosity=0)
    token = IngestToken.issue(Project.objects.create(slug="llm"))[1]
    rng = random.Random(11)
    # run-h starts 2.5 min before 10:00 UTC: its GpuHour rows straddle an hour.
    batches = random_batches(rng) + random_batches(rng, run="run-h", t0=T0 - 150)
    deliveries = batches + rng.sample(batches, len(batches) // 3)
    rng.shuffle(deliveries)
    stored = sum(ingest_batch(copy.deepcopy(b), token=token)["stored"] for b in deliveries)
    ingest_batch(batch(rank=0, host="n", run="run-2",
                       steps=[(7, T0 + 59.9999996, None, None, 1.5, 0.25)]), token=token)

    run = Run.objects.get(name="run-1")
    steps, gpus = step_aggregates(run), gpu_aggregates(run)
    coarse = {name: (host_aggregates(r), hour_aggregates(r))
              for name, r in ((n, Run.objects.get(name=n)) for n in ("run-1", "run-h"))}

    def check() -> None:
        assert_same(stored_steps(run), steps, STEP_NUMBERS, STEP_SUMS)
        assert_same(stored_gpus(run), gpus, GPU_NUMBERS, GPU_SUMS)
        for name, (hosts, hours) in coarse.items():
            r = Run.objects.get(name=name)
            assert_same(stored_hosts(r), hosts, HOST_NUMBERS, HOST_SUMS)
            assert_same(stored_hours(r), hours, GPU_NUMBERS, GPU_SUMS)

    check()
    call_command("rebuild_rollups", verbosity=0)
    check()

    # The pages' portable reads (the ORM over HostMinute and GpuHour) agree with the raw rows.
    from collectors import cluster_reads

    crossing = Run.objects.get(name="run-h")
    hosts, hours = coarse["run-h"]
    per_minute: dict = {}
    for (_, minute), agg in hosts.items():
        per_minute[minute.timestamp()] = per_minute.get(minute.timestamp(), 0) + agg["gpus"]
    power = cluster_reads.minute_power(crossing).minutes.series
    assert {power.start + 60 * i: int(n) for i, n in enumerate(power.gpus) if n} == per_minute
    cells = {(c.host, c.gpu, c.bucket): (c.samples, c.throttled, c.throttle_bits)
             for c in cluster_reads.gpu_cells(crossing, 3600)}
    assert cells == {(h, g, hour.timestamp()): (a["samples"], a["throttled"], a["throttle_bits"])
                     for (h, g, hour), a in hours.items()}

    edge = StepMetric.objects.get(run__name="run-2")
    print(json.dumps({
        "stored": stored, "batches": len(batches),
        "steps": StepMetric.objects.filter(run=run).count(),
        "gpu_samples": GpuSample.objects.filter(run=run).count(),
        "hosts": sorted(set(GpuSample.objects.values_list("host", flat=True))),
        "step_minutes": len(steps), "gpu_minutes": len(gpus),
        "gpu_hours": {name: sorted({k[2].hour for k in hours}) for name, (_, hours) in coarse.items()},
        "edge": [edge.ts.isoformat(), edge.duration_s, edge.tokens, edge.loss, edge.extra],
    }))


if __name__ == "__main__":
    main()
