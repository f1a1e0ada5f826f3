"""Bulk inserts of telemetry rows: binary COPY on PostgreSQL, bulk_create elsewhere.

COPY is the fastest way into PostgreSQL by a wide margin (shared/BENCHMARKING.md: ~6x text COPY,
~15x executemany), and a batch is already columnar, so rows stream straight into it.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection
from django.db.models import Model
from psycopg.types.json import Jsonb

# (column, PostgreSQL type) in the order the row tuples of collectors.ingest are built.
STEP_COLUMNS = (
    ("run_id", "int8"), ("attempt_id", "int8"), ("rank", "int4"), ("step", "int8"),
    ("ts", "timestamptz"), ("duration_s", "float8"), ("tokens", "int8"), ("loss", "float8"),
    ("lr", "float8"), ("grad_norm", "float8"), ("extra", "jsonb"),
)
GPU_COLUMNS = (
    ("run_id", "int8"), ("attempt_id", "int8"), ("host", "varchar"), ("gpu", "int2"),
    ("ts", "timestamptz"), ("temp_c", "float8"), ("power_w", "float8"), ("util_pct", "float8"),
    ("mem_used_mb", "float8"), ("sm_clock_mhz", "float8"), ("throttle", "int8"),
    ("simulated", "bool"),
)
EVENT_COLUMNS = (
    ("run_id", "int8"), ("attempt_id", "int8"), ("rank", "int4"), ("host", "varchar"),
    ("kind", "varchar"), ("ts", "timestamptz"), ("payload", "jsonb"),
)


def write(model: type[Model], columns: Sequence[tuple[str, str]], rows: list[tuple]) -> None:
    """Inserts ``rows`` (tuples in ``columns`` order) into ``model``'s table, in the current
    transaction."""
    if not rows:
        return
    names = [name for name, _ in columns]
    if connection.vendor == "postgresql":
        _copy(model._meta.db_table, columns, rows)
    else:
        model.objects.bulk_create([model(**dict(zip(names, row, strict=True))) for row in rows],
                                  batch_size=500)


def _copy(table: str, columns: Sequence[tuple[str, str]], rows: list[tuple]) -> None:
    json_at = [i for i, (_, kind) in enumerate(columns) if kind == "jsonb"]
    names = ", ".join(f'"{name}"' for name, _ in columns)
    with connection.cursor() as cursor:
        # Django's wrapper hides psycopg's copy(); the raw cursor shares its connection and
        # transaction.
        with cursor.cursor.copy(f'COPY "{table}" ({names}) FROM STDIN (FORMAT BINARY)') as copy:
            copy.set_types([kind for _, kind in columns])
            if json_at:
                for row in rows:
                    row = list(row)
                    for i in json_at:
                        row[i] = Jsonb(row[i])
                    copy.write_row(row)
            else:
                for row in rows:
                    copy.write_row(row)
