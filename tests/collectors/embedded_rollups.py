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
        T0,
        across_the_hour_batches,
        assert_rollups,
        batch,
        expected_rollups,
        with_redeliveries,
    )

    assert settings.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3"
    call_command("migrate", verbosity=0)
    token = IngestToken.issue(Project.objects.create(slug="llm"))[1]
    rng = random.Random(11)
    batches = across_the_hour_batches(rng)
    stored = sum(ingest_batch(copy.deepcopy(b), token=token)["stored"]
                 for b in with_redeliveries(rng, batches))
    ingest_batch(batch(rank=0, host="n", run="run-2",
                       steps=[(7, T0 + 59.9999996, None, None, 1.5, 0.25)]), token=token)

    runs = [Run.objects.get(name=name) for name in ("run-1", "run-h")]
    expected = {r.name: expected_rollups(r) for r in runs}

    def check() -> None:
        for r in runs:
            assert_rollups(r, expected[r.name])

    check()
    call_command("rebuild_rollups", verbosity=0)
    check()

    # The pages' portable reads (the ORM over HostMinute and GpuHour) agree with the raw rows.
    from collectors import cluster_reads

    run, crossing = runs
    hosts, hours = expected["run-h"]["hosts"], expected["run-h"]["hours"]
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
        "step_minutes": len(expected["run-1"]["steps"]),
        "gpu_minutes": len(expected["run-1"]["gpus"]),
        "gpu_hours": {name: sorted({k[2].hour for k in rollups["hours"]})
                      for name, rollups in expected.items()},
        "edge": [edge.ts.isoformat(), edge.duration_s, edge.tokens, edge.loss, edge.extra],
    }))


if __name__ == "__main__":
    main()
