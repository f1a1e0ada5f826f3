"""Bulk inserts of telemetry tables: binary COPY on PostgreSQL, bulk_create elsewhere.

COPY is the fastest way into PostgreSQL by a wide margin (shared/BENCHMARKING.md: ~6x text COPY,
~15x executemany), and a batch is already columnar. Handing psycopg one Python tuple per row cost
more than the COPY itself (bench/README.md), so the COPY payload is built a column at a time with
numpy: every row of a table has the same fixed-width fields (a batch has one run, attempt, host and
rank), so the rows are one structured array; nulls and per-row variable fields (jsonb, the kind of
an event) are spliced in by index arithmetic rather than by a Python loop over rows.

Binary COPY format: https://www.postgresql.org/docs/15/sql-copy.html#id-1.9.3.55.9.4
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from django.db import DataError, connection
from django.db.models import Model

# (column, PostgreSQL type) of each telemetry table; Table.data is keyed by these names.
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

_FIXED = {"int8": ">i8", "int4": ">i4", "int2": ">i2", "float8": ">f8", "bool": "u1",
          "timestamptz": ">i8"}
_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
_TRAILER = b"\xff\xff"
# PostgreSQL counts timestamps in microseconds from 2000-01-01 UTC.
_PG_EPOCH_MICROS = 946_684_800 * 1_000_000
_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class JsonTexts(list):
    """A jsonb column given as one JSON text per row, already encoded by the caller (who can build
    the text of a fixed set of keys faster than json.dumps builds it from a dict)."""


@dataclass(frozen=True)
class Table:
    """Rows of one table by column. A value in ``data`` is either one Python value for every row
    (the run, the host), a numpy array (float NaN = null; a masked array for nullable integers;
    timestamps as int64 microseconds since the Unix epoch), or a list with one Python value per row
    (jsonb payloads, an event's kind; see JsonTexts)."""

    columns: Sequence[tuple[str, str]]
    data: dict[str, Any]
    length: int


def write(model: type[Model], table: Table) -> None:
    """Inserts ``table``'s rows into ``model``'s table, in the current transaction."""
    write_many(model, [table])


def write_many(model: type[Model], tables: Sequence[Table]) -> None:
    """Inserts the rows of several tables (several batches' rows for one model) in the current
    transaction: on PostgreSQL one COPY for all of them, since each COPY statement has a fixed
    cost in both processes (parse, partition routing setup, a round trip) that small batches
    would otherwise pay one by one."""
    tables = [table for table in tables if table.length]
    if not tables:
        return
    if connection.vendor != "postgresql":
        for table in tables:
            names = [name for name, _ in table.columns]
            model.objects.bulk_create(
                [model(**dict(zip(names, row, strict=True))) for row in python_rows(table)],
                batch_size=500,
            )
        return
    # A table's column order depends on which of its columns are constants (fixed width) and
    # which are per-row lists, so tables are grouped by that order: one COPY per order, and in
    # practice one in all (every batch of a model has the same shape).
    by_order: dict[tuple, list[bytes]] = {}
    for table in _merged(tables):
        # Variable-width fields go last: each row is then its fixed part followed by them.
        ordered = tuple(sorted(table.columns, key=lambda c: not _is_fixed(c[1], table.data[c[0]])))
        payload = copy_payload(ordered, table.data, table.length)
        by_order.setdefault(ordered, []).append(payload[len(_SIGNATURE):-len(_TRAILER)])
    with connection.cursor() as cursor:
        for ordered, bodies in by_order.items():
            names = ", ".join(f'"{name}"' for name, _ in ordered)
            # Django's wrapper hides psycopg's copy(); the raw cursor shares its connection and
            # transaction. Writing whole blocks means the payload carries signature and trailer.
            with cursor.cursor.copy(
                f'COPY "{model._meta.db_table}" ({names}) FROM STDIN (FORMAT BINARY)'
            ) as copy:
                copy.write(_SIGNATURE + b"".join(bodies) + _TRAILER)


def _merged(tables: Sequence[Table]) -> list[Table]:
    """The tables as few tables as their shapes allow: those whose every column has the same form
    (a constant, an array of one dtype, masked or not, per-row texts) become one, each constant
    that differs between them becoming a column of its per-row values. Building a COPY payload
    costs a few dozen numpy calls whatever its length, which for a drain of 32 batches of 480 GPU
    rows was most of the payload's cost (bench/README.md); concatenated, they are paid once."""
    if len(tables) < 2:
        return list(tables)
    groups: dict[tuple, list[Table]] = {}
    for table in tables:
        groups.setdefault(_form(table), []).append(table)
    return [group[0] if len(group) == 1 else _concatenated(group) for group in groups.values()]


def _form(table: Table) -> tuple:
    """What must match for tables to be concatenated column by column: each column's kind of
    value, and for a constant string its encoded length (it becomes a fixed-width column)."""
    form = []
    for name, kind in table.columns:
        value = table.data[name]
        if isinstance(value, JsonTexts):
            form.append("texts")
        elif isinstance(value, list):
            form.append("list")
        elif isinstance(value, np.ma.MaskedArray):
            form.append(("masked", value.dtype.str))
        elif isinstance(value, np.ndarray):
            form.append(("array", value.dtype.str))
        elif value is None:
            form.append("null")
        elif kind in ("varchar", "jsonb"):
            form.append(("bytes", len(_constant_bytes(kind, value))))
        else:
            form.append(("constant", type(value)))
    return (tuple(table.columns), tuple(form))


def _concatenated(tables: list[Table]) -> Table:
    """Tables of one form (see _form) as one."""
    first = tables[0]
    lengths = [table.length for table in tables]
    data: dict[str, Any] = {}
    for name, kind in first.columns:
        values = [table.data[name] for table in tables]
        head = values[0]
        if isinstance(head, JsonTexts):
            data[name] = JsonTexts(text for texts in values for text in texts)
        elif isinstance(head, list):
            data[name] = [value for column in values for value in column]
        elif isinstance(head, np.ma.MaskedArray):
            data[name] = np.ma.concatenate(values)
        elif isinstance(head, np.ndarray):
            data[name] = np.concatenate(values)
        elif all(value == head and type(value) is type(head) for value in values[1:]):
            data[name] = head  # the same constant (or null) in every table stays one
        elif kind in ("varchar", "jsonb"):
            encoded = [_constant_bytes(kind, value) for value in values]
            data[name] = np.repeat(np.array(encoded, dtype=f"S{len(encoded[0])}"), lengths)
        else:
            data[name] = np.repeat(np.asarray(values, dtype=_FIXED[kind].lstrip(">")), lengths)
    return Table(first.columns, data, sum(lengths))


def _is_fixed(kind: str, value: Any) -> bool:
    if isinstance(value, list):
        return False
    return kind in _FIXED or kind in ("varchar", "jsonb")  # a constant string/json is fixed too


def _constant_bytes(kind: str, value: Any) -> bytes:
    if kind == "varchar":
        return str(value).encode()
    if kind == "jsonb":
        # jsonb's binary input is a version byte (1) followed by the JSON text.
        return b"\x01" + json.dumps(value).encode()
    raise TypeError(f"no constant encoding for {kind}")


def _fixed_column(kind: str, value: Any, length: int) -> tuple[np.dtype, Any, np.ndarray | None]:
    """(field dtype, values to assign, null mask or None) for one fixed-width column."""
    if value is None:
        dtype = np.dtype(_FIXED.get(kind, "S1"))
        return dtype, 0, np.ones(length, dtype=bool)
    if kind in ("varchar", "jsonb"):
        if isinstance(value, np.ndarray):  # per-row strings of one encoded length (_merged)
            return value.dtype, value, None
        encoded = _constant_bytes(kind, value)
        return np.dtype(f"S{max(len(encoded), 1)}"), encoded, None
    dtype = np.dtype(_FIXED[kind])
    if not isinstance(value, np.ndarray):
        return dtype, _checked(kind, np.asarray([value]))[0], None
    nulls = None
    if isinstance(value, np.ma.MaskedArray):
        mask = np.ma.getmaskarray(value)
        nulls = mask if mask.any() else None
        value = value.filled(0)
    elif value.dtype.kind == "f":
        missing = np.isnan(value)
        if missing.any():
            nulls = missing
            value = np.where(missing, 0.0, value)
    if kind == "timestamptz":
        value = value - _PG_EPOCH_MICROS
    return dtype, _checked(kind, value), nulls


def _checked(kind: str, values: np.ndarray) -> np.ndarray:
    """Refuses integers that do not fit their column, as PostgreSQL would: numpy would wrap."""
    if kind in ("int2", "int4", "int8") and values.size:
        info = np.iinfo(_FIXED[kind].lstrip(">"))
        if values.min() < info.min or values.max() > info.max:
            raise DataError(f"a value does not fit the {kind} column")
    return values


def _variable_column(kind: str, values: list) -> list[bytes]:
    if isinstance(values, JsonTexts):
        return [b"\x01" + text.encode() for text in values]
    if kind == "jsonb":
        return [b"\x01" + json.dumps(value).encode() for value in values]
    if kind == "varchar":
        return [str(value).encode() for value in values]
    raise TypeError(f"no per-row encoding for {kind}")


def copy_payload(columns: Sequence[tuple[str, str]], data: dict[str, Any], length: int) -> bytes:
    """The whole binary COPY stream for ``length`` rows: fixed-width columns first, then the
    columns given as per-row lists (the caller orders them so)."""
    fixed = [(name, kind) for name, kind in columns if _is_fixed(kind, data[name])]
    variable = [(name, kind) for name, kind in columns if not _is_fixed(kind, data[name])]

    specs = [_fixed_column(kind, data[name], length) for name, kind in fixed]
    fields: list[tuple[str, Any]] = [("count", ">i2")]
    for i, (dtype, _, _) in enumerate(specs):
        fields += [(f"len{i}", ">i4"), (f"val{i}", dtype)]
    rows = np.zeros(length, dtype=np.dtype(fields))
    rows["count"] = len(columns)
    keep = None  # which bytes of each fixed-width row survive (a null field has no value bytes)
    for i, (dtype, value, nulls) in enumerate(specs):
        rows[f"len{i}"] = dtype.itemsize
        rows[f"val{i}"] = value
        if nulls is not None:
            rows[f"len{i}"][nulls] = -1
            if keep is None:
                keep = np.ones((length, rows.dtype.itemsize), dtype=bool)
            start = rows.dtype.fields[f"val{i}"][1]
            keep[nulls, start:start + dtype.itemsize] = False

    if keep is None and not variable:
        return _SIGNATURE + rows.tobytes() + _TRAILER
    matrix = rows.view(np.uint8).reshape(length, rows.dtype.itemsize)
    if keep is None:
        streams = [(matrix.reshape(-1), np.full(length, rows.dtype.itemsize, dtype=np.int64))]
    else:
        streams = [(matrix[keep], keep.sum(axis=1, dtype=np.int64))]
    for name, kind in variable:
        encoded = _variable_column(kind, data[name])
        sizes = np.fromiter(map(len, encoded), dtype=np.int64, count=length)
        streams.append((sizes.astype(">i4").view(np.uint8), np.full(length, 4, dtype=np.int64)))
        streams.append((np.frombuffer(b"".join(encoded), dtype=np.uint8), sizes))
    return _SIGNATURE + _interleave(streams).tobytes() + _TRAILER


def _interleave(streams: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Concatenates row i of every stream, for each row in turn. A stream is its rows' bytes end to
    end (flat uint8) and the byte length of each row."""
    sizes = np.stack([size for _, size in streams])  # (streams, rows)
    row_sizes = sizes.sum(axis=0)
    row_starts = np.cumsum(row_sizes) - row_sizes
    starts = row_starts + np.cumsum(sizes, axis=0) - sizes  # where stream k's part of row i goes
    out = np.empty(int(row_sizes.sum()), dtype=np.uint8)
    for (flat, size), start in zip(streams, starts, strict=True):
        source_starts = np.cumsum(size) - size
        out[np.repeat(start - source_starts, size) + np.arange(flat.size)] = flat
    return out


def python_rows(table: Table) -> list[tuple]:
    """The rows as tuples of Python values (None for null, aware datetimes), in column order."""
    columns = []
    for name, kind in table.columns:
        value = table.data[name]
        if isinstance(value, JsonTexts):
            columns.append([json.loads(text) for text in value])
        elif isinstance(value, list):
            columns.append(value)
        elif not isinstance(value, np.ndarray):
            columns.append([value] * table.length)
        else:
            if isinstance(value, np.ma.MaskedArray):
                nulls = np.ma.getmaskarray(value)
                value = value.filled(0)
            elif value.dtype.kind == "f":
                nulls = np.isnan(value)
            else:
                nulls = np.zeros(table.length, dtype=bool)
            if kind == "timestamptz":
                values = [_UNIX_EPOCH + timedelta(microseconds=us) for us in value.tolist()]
            elif kind == "bool":
                values = [bool(v) for v in value.tolist()]
            else:
                values = value.tolist()
            columns.append([None if null else v
                            for v, null in zip(values, nulls.tolist(), strict=True)])
    return list(zip(*columns, strict=True))
