"""The column-wise binary COPY (collectors.bulk_write) stores exactly what the row-by-row COPY it
replaced stored: psycopg's write_row with datetimes and Jsonb, kept here as the reference."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import numpy as np
import pytest
from django.db import DataError, connection
from psycopg.types.json import Jsonb

from collectors import bulk_write
from collectors.models import Attempt, Event, GpuSample, Run, StepMetric
from collectors.tasks import ingest_batch, store_drained
from trainer_plugin import protocol

# Fractions that round differently under careless arithmetic: half a microsecond (to even), just
# below a whole second, the epoch itself, a 2100 date, a microsecond.
TIMESTAMPS = [1_796_292_000.0000005, 1_796_292_000.0000015, 1_796_292_000.9999995,
              1_796_292_059.9999996, 0.0, 4_102_444_800.123456, 1e-6, 1_700_000_000.25]
HOST = "nöde-ü1-東京"


def tricky_batch(*, extra_nulls: bool) -> dict:
    n = len(TIMESTAMPS)
    accuracy = [0.1, 1e-05, 1e16, 3, 0.5, 2.5e-300, 7.0, 0.3]
    if extra_nulls:
        accuracy[2] = None
    steps = {"step": [0, 1, 2**62, 3, 4, 5, 6, 7], "ts": TIMESTAMPS,
             "duration_s": [0.5, None, 1.25, 0, 1e-9, None, 3, 2.0],
             "tokens": [4096, None, 0, 2**62, 1, 2, None, 3],
             "metrics": {"loss": [None, 2.0, 1.5, 1.0, 0.9, 0.8, 0.7, float(2**60)],
                         "grad_norm": [1.0] * n, "accuracy": accuracy,
                         "eval/ppl": [5.0, None, 5.5, 6, 6.5, 7, 7.5, 8]}}
    gpus = {"ts": TIMESTAMPS, "gpu": [0, 1, 2, 3, 4, 5, 6, 32767],
            "temp_c": [60.0, None, 61.5, 0, 70, 71.25, None, 99.9],
            "power_w": [350.0] * n, "util_pct": [None] * n,
            "mem_used_mb": [40000.0, 1.5, None, 0.0, 1e6, 2, 3, 4],
            "sm_clock_mhz": [1980, 1980.5, 1000, None, 1, 2, 3, 4],
            "throttle": [0, None, 2**62, 4, 0, 1, None, 8], "simulated": True}
    events = [{"kind": "heartbeat", "ts": TIMESTAMPS[0], "note": "ünïcode ✓", "n": 3},
              {"kind": "xid", "ts": TIMESTAMPS[2], "xid": 79, "gpu": 3, "nested": {"a": [1, None]}}]
    return protocol.make_batch(
        run={"project": "llm", "name": "fast", "attempt": 0},
        source={"host": HOST, "rank": 3, "local_rank": 3, "world_size": 8},
        steps=steps, gpus=gpus, events=events)


def reference_write(batch: dict, run: Run, attempt: Attempt) -> None:
    """The previous write path, row by row: psycopg adapts each datetime, float and Jsonb."""
    def when(ts):
        return datetime.fromtimestamp(ts, tz=UTC)

    steps, gpus, source = batch["steps"], batch["gpus"], batch["source"]
    metrics = steps["metrics"]
    extra_names = [m for m in metrics if m not in ("loss", "lr", "grad_norm")]
    step_rows = [
        (run.pk, attempt.pk, source["rank"], step, when(ts), duration, tokens,
         metrics["loss"][i] if "loss" in metrics else None, None, metrics["grad_norm"][i],
         Jsonb({m: metrics[m][i] for m in extra_names if metrics[m][i] is not None}))
        for i, (step, ts, duration, tokens) in enumerate(
            zip(steps["step"], steps["ts"], steps["duration_s"], steps["tokens"], strict=True))
    ]
    gpu_rows = [
        (run.pk, attempt.pk, source["host"], gpu, when(ts), temp, power, util, mem, clock,
         throttle, gpus["simulated"])
        for ts, gpu, temp, power, util, mem, clock, throttle in zip(
            gpus["ts"], gpus["gpu"], gpus["temp_c"], gpus["power_w"], gpus["util_pct"],
            gpus["mem_used_mb"], gpus["sm_clock_mhz"], gpus["throttle"], strict=True)
    ]
    event_rows = [
        (run.pk, attempt.pk, source["rank"], source["host"], e["kind"], when(e["ts"]),
         Jsonb({k: v for k, v in e.items() if k not in ("kind", "ts")}))
        for e in batch["events"]
    ]
    tables = (
        ("collectors_stepmetric", "run_id, attempt_id, rank, step, ts, duration_s, tokens, loss, "
         "lr, grad_norm, extra", ["int8", "int8", "int4", "int8", "timestamptz", "float8", "int8",
                                  "float8", "float8", "float8", "jsonb"], step_rows),
        ("collectors_gpusample", "run_id, attempt_id, host, gpu, ts, temp_c, power_w, util_pct, "
         "mem_used_mb, sm_clock_mhz, throttle, simulated",
         ["int8", "int8", "varchar", "int2", "timestamptz", "float8", "float8", "float8", "float8",
          "float8", "int8", "bool"], gpu_rows),
        ("collectors_event", "run_id, attempt_id, rank, host, kind, ts, payload",
         ["int8", "int8", "int4", "varchar", "varchar", "timestamptz", "jsonb"], event_rows),
    )
    with connection.cursor() as cursor:
        for table, names, types, rows in tables:
            with cursor.cursor.copy(f"COPY {table} ({names}) FROM STDIN (FORMAT BINARY)") as out:
                out.set_types(types)
                for row in rows:
                    out.write_row(row)


def stored(model, run: Run, order: tuple[str, ...]) -> list[tuple]:
    fields = [f.attname for f in model._meta.concrete_fields
              if f.attname not in ("id", "run_id", "attempt_id")]
    return list(model.objects.filter(run=run).order_by(*order).values_list(*fields))


@pytest.mark.parametrize("extra_nulls", [False, True], ids=["extra-as-text", "extra-as-dicts"])
def test_copy_stores_exactly_what_the_row_by_row_path_stored(token, extra_nulls):
    batch = tricky_batch(extra_nulls=extra_nulls)
    assert ingest_batch(copy.deepcopy(batch), token=token)["stored"] is True
    fast = Run.objects.get(name="fast")
    reference = Run.objects.create(project=fast.project, name="reference")
    reference_write(protocol.validate_batch(copy.deepcopy(batch)), reference,
                    Attempt.objects.create(run=reference, number=0))

    for model, order in ((StepMetric, ("ts", "step")), (GpuSample, ("ts", "gpu")),
                         (Event, ("ts", "kind"))):
        expected = stored(model, reference, order)
        assert len(expected) == len(batch["events"] if model is Event else TIMESTAMPS)
        assert stored(model, fast, order) == expected, model.__name__
    # What the comparison covers, spelled out once.
    first = StepMetric.objects.filter(run=fast).order_by("ts").first()
    assert first.ts == datetime(1970, 1, 1, tzinfo=UTC)
    assert first.extra == {"accuracy": 0.5, "eval/ppl": 6.5}
    boundary = GpuSample.objects.get(run=fast, gpu=3)
    assert boundary.ts == datetime(2026, 12, 3, 10, 1, tzinfo=UTC)
    assert (boundary.host, boundary.sm_clock_mhz, boundary.throttle) == (HOST, None, 4)
    assert GpuSample.objects.get(run=fast, gpu=2).throttle == 2**62


def test_batches_stored_together_store_what_each_stored_alone_would(token):
    # One drain's batches are concatenated into one COPY per table where their columns have the
    # same form: hosts of one encoded length become a fixed-width column, differing constants
    # (rank, simulated) per-row values; other forms (extra as dicts, an absent metric, a host of
    # another length) are written beside them.
    def variant(host: str, rank: int, *, extra_nulls=False, simulated=True, loss=True) -> dict:
        batch = tricky_batch(extra_nulls=extra_nulls)
        batch["source"].update(host=host, rank=rank)
        batch["gpus"]["simulated"] = simulated
        if not loss:
            del batch["steps"]["metrics"]["loss"]
        return batch

    batches = [variant(HOST, 0), variant("node-2", 1, simulated=False), variant("node-3", 2),
               variant("node-4", 3, extra_nulls=True), variant("node-55", 4, loss=False),
               variant("node-6", 5, simulated=False)]
    store_drained([(str(i), copy.deepcopy(batch), token) for i, batch in enumerate(batches)])
    together = Run.objects.get(name="fast")
    reference = Run.objects.create(project=together.project, name="reference")
    attempt = Attempt.objects.create(run=reference, number=0)
    for batch in batches:
        reference_write(protocol.validate_batch(copy.deepcopy(batch)), reference, attempt)

    for model, order in ((StepMetric, ("ts", "rank", "step")), (GpuSample, ("ts", "host", "gpu")),
                         (Event, ("ts", "host", "kind"))):
        expected = stored(model, reference, order)
        per_batch = len(batches[0]["events"] if model is Event else TIMESTAMPS)
        assert len(expected) == per_batch * len(batches)
        assert stored(model, together, order) == expected, model.__name__
    assert set(GpuSample.objects.filter(run=together, simulated=False)
               .values_list("host", flat=True)) == {"node-2", "node-6"}


def test_a_value_too_large_for_its_column_is_refused_not_wrapped(db):
    # The wire format refuses such values first; this is the write path's own guard, because
    # numpy would silently wrap 40,000 into a smallint.
    table = bulk_write.Table((("gpu", "int2"), ("ts", "timestamptz")),
                             {"gpu": np.array([1, 40_000]), "ts": np.array([0, 0])}, 2)

    with pytest.raises(DataError, match="int2"):
        bulk_write.write(GpuSample, table)
