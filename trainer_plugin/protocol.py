"""Runwatch wire format, version 1.

One message is one *batch* from one training process. Tables are columnar (a dict of equal-length
lists) so that both validation and the database write work a column at a time.

    {"v": 1, "batch_id": "<uuid4>",
     "run": {"project": "llm", "name": "llama-8b", "attempt": 0, "config": {...}},
     "source": {"host": "node017", "rank": 5, "local_rank": 5, "world_size": 128},
     "steps": {"step": [...], "ts": [...], "duration_s": [...], "tokens": [...],
               "metrics": {"loss": [...], "lr": [...]}},
     "gpus": {"ts": [...], "gpu": [...], "temp_c": [...], "power_w": [...], "util_pct": [...],
              "mem_used_mb": [...], "sm_clock_mhz": [...], "throttle": [...], "simulated": false},
     "events": [{"kind": "start", "ts": 1700000000.0, ...}]}

Timestamps are Unix seconds (float, UTC). Every number must be finite: JSON has no NaN, and a
collector that stored one could not compute a mean afterwards. The plugin sends a non-finite
metric (a diverged loss) as ``null``.

This module is shared by the plugin (which builds batches) and the collectors (which validate
them); it is pure Python and imports nothing outside the standard library.
"""

from __future__ import annotations

import math
import re
import uuid
from typing import Any

VERSION = 1

#: Largest request body the ingest API accepts, after gzip decompression.
MAX_BATCH_BYTES = 16 * 1024 * 1024
#: Largest number of rows in one table of one batch.
MAX_ROWS = 100_000
MAX_EVENTS = 10_000
MAX_METRICS = 64
MAX_CONFIG_BYTES = 64 * 1024

EVENT_KINDS = frozenset(
    {
        "start",
        "finish",
        "interruption",
        "checkpoint_save",
        "checkpoint_load",
        "xid",
        # A rise of a GPU's volatile ECC error counters, sent by the GPU sampler: evidence for an
        # interruption's root cause (gpu_memory) beside XIDs.
        "ecc",
        "heartbeat",
    }
)

STEP_COLUMNS = ("step", "ts", "duration_s", "tokens")
GPU_COLUMNS = ("ts", "gpu", "temp_c", "power_w", "util_pct", "mem_used_mb", "sm_clock_mhz", "throttle")

_SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_METRIC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}$")


class ProtocolError(ValueError):
    """A batch that does not follow the wire format. The message says what to fix."""

    status = 400

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class BatchTooLarge(ProtocolError):
    status = 413


def new_batch_id() -> str:
    return str(uuid.uuid4())


def empty_steps() -> dict[str, Any]:
    return {"step": [], "ts": [], "duration_s": [], "tokens": [], "metrics": {}}


def empty_gpus() -> dict[str, Any]:
    return {column: [] for column in GPU_COLUMNS}


def make_batch(
    *,
    run: dict[str, Any],
    source: dict[str, Any],
    steps: dict[str, Any] | None = None,
    gpus: dict[str, Any] | None = None,
    events: list[dict[str, Any]] | None = None,
    batch_id: str | None = None,
) -> dict[str, Any]:
    return {
        "v": VERSION,
        "batch_id": batch_id or new_batch_id(),
        "run": run,
        "source": source,
        "steps": steps if steps is not None else empty_steps(),
        "gpus": gpus if gpus is not None else empty_gpus(),
        "events": events if events is not None else [],
    }


def row_count(batch: dict[str, Any]) -> int:
    return len(batch["steps"]["step"]) + len(batch["gpus"]["ts"]) + len(batch["events"])


# --- validation -------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    # bool is an int subclass; a True where a step number belongs is a bug, not a 1.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return _is_int(value)


def _require_dict(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(f"'{field}' must be an object", field)
    return value


def _require_str(obj: dict[str, Any], key: str, field: str, pattern: re.Pattern | None = None,
                 max_len: int = 255) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value or len(value) > max_len:
        raise ProtocolError(f"'{field}' must be a non-empty string of at most {max_len} characters",
                            field)
    if pattern is not None and not pattern.match(value):
        raise ProtocolError(
            f"'{field}' may only hold letters, digits, '_', '.' and '-' (got {value!r})", field
        )
    return value


def _require_int(obj: dict[str, Any], key: str, field: str, minimum: int = 0) -> int:
    value = obj.get(key)
    if not _is_int(value) or value < minimum:
        raise ProtocolError(f"'{field}' must be an integer >= {minimum}", field)
    return value


def _check_column(values: Any, field: str, kind: str, length: int | None) -> int:
    """Checks one column; ``kind`` is 'ts' (finite number, required), 'int' (>= 0, required),
    'number?' (finite or null) or 'int?' (>= 0 or null). Returns the column's length."""
    if not isinstance(values, list):
        raise ProtocolError(f"'{field}' must be a list", field)
    if length is not None and len(values) != length:
        raise ProtocolError(
            f"columns must have equal lengths: '{field}' has {len(values)} values, expected {length}",
            field,
        )
    if len(values) > MAX_ROWS:
        raise BatchTooLarge(f"'{field}' has {len(values)} rows; a batch holds at most {MAX_ROWS}",
                            field)
    if kind == "ts":
        bad = next((i for i, v in enumerate(values) if not _is_number(v) or v < 0), None)
        what = "a finite, non-negative Unix timestamp"
    elif kind == "int":
        bad = next((i for i, v in enumerate(values) if not _is_int(v) or v < 0), None)
        what = "an integer >= 0"
    elif kind == "int?":
        bad = next(
            (i for i, v in enumerate(values) if v is not None and (not _is_int(v) or v < 0)), None
        )
        what = "an integer >= 0 or null"
    else:
        bad = next((i for i, v in enumerate(values) if v is not None and not _is_number(v)), None)
        what = "a finite number or null"
    if bad is not None:
        raise ProtocolError(f"'{field}[{bad}]' must be {what} (got {values[bad]!r})", field)
    return len(values)


def _validate_steps(steps: Any) -> None:
    steps = _require_dict(steps, "steps")
    unknown = set(steps) - {*STEP_COLUMNS, "metrics"}
    if unknown:
        raise ProtocolError(f"'steps' has unknown columns {sorted(unknown)}", "steps")
    for column in STEP_COLUMNS:
        steps.setdefault(column, [])
    length = _check_column(steps["step"], "steps.step", "int", None)
    _check_column(steps["ts"], "steps.ts", "ts", length)
    _check_column(steps["duration_s"], "steps.duration_s", "number?", length)
    _check_column(steps["tokens"], "steps.tokens", "int?", length)
    metrics = _require_dict(steps.setdefault("metrics", {}), "steps.metrics")
    if len(metrics) > MAX_METRICS:
        raise ProtocolError(f"'steps.metrics' has {len(metrics)} series; at most {MAX_METRICS}",
                            "steps.metrics")
    for name, values in metrics.items():
        if not _METRIC_NAME.match(name):
            raise ProtocolError(f"metric name {name!r} must be an identifier of at most 64 "
                                "characters (letters, digits, '_', '.', '/', '-')", "steps.metrics")
        _check_column(values, f"steps.metrics.{name}", "number?", length)


def _validate_gpus(gpus: Any) -> None:
    gpus = _require_dict(gpus, "gpus")
    unknown = set(gpus) - {*GPU_COLUMNS, "simulated"}
    if unknown:
        raise ProtocolError(f"'gpus' has unknown columns {sorted(unknown)}", "gpus")
    for column in GPU_COLUMNS:
        gpus.setdefault(column, [])
    if not isinstance(gpus.setdefault("simulated", False), bool):
        raise ProtocolError("'gpus.simulated' must be true or false", "gpus.simulated")
    length = _check_column(gpus["ts"], "gpus.ts", "ts", None)
    _check_column(gpus["gpu"], "gpus.gpu", "int", length)
    for column in ("temp_c", "power_w", "util_pct", "mem_used_mb", "sm_clock_mhz"):
        _check_column(gpus[column], f"gpus.{column}", "number?", length)
    _check_column(gpus["throttle"], "gpus.throttle", "int?", length)


def _validate_events(events: Any) -> None:
    if not isinstance(events, list):
        raise ProtocolError("'events' must be a list", "events")
    if len(events) > MAX_EVENTS:
        raise BatchTooLarge(f"'events' has {len(events)} entries; a batch holds at most {MAX_EVENTS}",
                            "events")
    for i, event in enumerate(events):
        field = f"events[{i}]"
        _require_dict(event, field)
        kind = event.get("kind")
        if kind not in EVENT_KINDS:
            raise ProtocolError(
                f"'{field}.kind' must be one of {', '.join(sorted(EVENT_KINDS))} (got {kind!r})",
                f"{field}.kind",
            )
        ts = event.get("ts")
        if not _is_number(ts) or ts < 0:
            raise ProtocolError(f"'{field}.ts' must be a finite, non-negative Unix timestamp",
                                f"{field}.ts")
        for key, value in event.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ProtocolError(f"'{field}.{key}' must be finite", f"{field}.{key}")


def validate_batch(batch: Any) -> dict[str, Any]:
    """Checks a decoded batch against the v1 format and fills in absent tables as empty.

    Raises ProtocolError (or BatchTooLarge) naming the first thing that is wrong; returns the batch.
    """
    batch = _require_dict(batch, "batch")
    version = batch.get("v")
    if version != VERSION:
        raise ProtocolError(
            f"unsupported wire format version {version!r}; this collector speaks v{VERSION}", "v"
        )
    batch_id = batch.get("batch_id")
    try:
        uuid.UUID(str(batch_id))
    except ValueError:
        raise ProtocolError("'batch_id' must be a UUID", "batch_id") from None
    if not isinstance(batch_id, str):
        raise ProtocolError("'batch_id' must be a UUID string", "batch_id")

    run = _require_dict(batch.get("run"), "run")
    _require_str(run, "project", "run.project", _SLUG, max_len=100)
    _require_str(run, "name", "run.name", max_len=200)
    _require_int(run, "attempt", "run.attempt")
    config = run.setdefault("config", {})
    if not isinstance(config, dict):
        raise ProtocolError("'run.config' must be an object", "run.config")
    if len(repr(config)) > MAX_CONFIG_BYTES:
        raise ProtocolError(f"'run.config' must stay under {MAX_CONFIG_BYTES} bytes", "run.config")

    source = _require_dict(batch.get("source"), "source")
    _require_str(source, "host", "source.host")
    rank = _require_int(source, "rank", "source.rank")
    _require_int(source, "local_rank", "source.local_rank")
    world_size = _require_int(source, "world_size", "source.world_size", minimum=1)
    if rank >= world_size:
        raise ProtocolError(f"'source.rank' ({rank}) must be below 'source.world_size' "
                            f"({world_size})", "source.rank")

    unknown = set(batch) - {"v", "batch_id", "run", "source", "steps", "gpus", "events"}
    if unknown:
        raise ProtocolError(f"batch has unknown keys {sorted(unknown)}", "batch")
    _validate_steps(batch.setdefault("steps", empty_steps()))
    _validate_gpus(batch.setdefault("gpus", empty_gpus()))
    _validate_events(batch.setdefault("events", []))
    return batch
