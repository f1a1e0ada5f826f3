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
import sys
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
#: Nesting depth of run.config and of an event's payload.
MAX_DEPTH = 32
MAX_PROJECT_CHARS = 100
MAX_RUN_NAME_CHARS = 200
MAX_HOST_CHARS = 255
# Bounds of what the database columns hold (steps, tokens, throttle bits: bigint; ranks and
# attempts: integer; GPU indexes: smallint), so an out-of-range value is a 400 naming the field
# instead of a failed write.
MAX_INT64 = 2**63 - 1
MAX_INT32 = 2**31 - 1
MAX_GPU_INDEX = 2**15 - 1
#: 9999-12-31T00:00Z: later timestamps have no datetime.
MAX_TIMESTAMP = 253402214400.0
#: An integer beyond this has no float; metric and sensor columns are stored as doubles.
MAX_NUMBER = sys.float_info.max

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

# Also the patterns of the ingest API's OpenAPI description (collectors.openapi), hence written
# for both dialects; matched with fullmatch, as JSON Schema's "$" does not allow a trailing newline.
SLUG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
METRIC_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}$"
_SLUG = re.compile(SLUG_PATTERN)
_METRIC_NAME = re.compile(METRIC_NAME_PATTERN)


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


def _is_text(value: str) -> bool:
    """No NUL (PostgreSQL text cannot hold one) and no lone surrogate (no UTF-8 for it)."""
    if "\x00" in value:
        return False
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_json(value: Any, field: str, depth: int = 0) -> None:
    """Free-form JSON (run.config, event payloads): text, depth and numbers the database can store."""
    if isinstance(value, str):
        if not _is_text(value):
            raise ProtocolError(f"'{field}' holds text with a NUL character or invalid UTF-8", field)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if not -MAX_INT64 <= value <= MAX_INT64:
            raise ProtocolError(f"'{field}' holds an integer beyond 64 bits", field)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ProtocolError(f"'{field}' holds a number that is not finite", field)
    elif isinstance(value, dict | list):
        if depth >= MAX_DEPTH:
            raise ProtocolError(f"'{field}' is nested deeper than {MAX_DEPTH} levels", field)
        for key, item in (value.items() if isinstance(value, dict) else enumerate(value)):
            if isinstance(value, dict) and not (isinstance(key, str) and _is_text(key)):
                raise ProtocolError(f"'{field}' holds a key that is not valid text", field)
            _check_json(item, field, depth + 1)
    else:
        raise ProtocolError(f"'{field}' holds a {type(value).__name__}, which is not JSON", field)


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
    if not _is_text(value):
        raise ProtocolError(f"'{field}' must be UTF-8 text without NUL characters", field)
    if pattern is not None and not pattern.fullmatch(value):
        raise ProtocolError(
            f"'{field}' may only hold letters, digits, '_', '.' and '-' (got {value!r})", field
        )
    return value


def _require_int(obj: dict[str, Any], key: str, field: str, minimum: int = 0,
                 maximum: int = MAX_INT32) -> int:
    value = obj.get(key)
    if not _is_int(value) or not minimum <= value <= maximum:
        raise ProtocolError(f"'{field}' must be an integer from {minimum} to {maximum}", field)
    return value


def _check_column(values: Any, field: str, kind: str, length: int | None,
                  maximum: int = MAX_INT64) -> int:
    """Checks one column; ``kind`` is 'ts' (finite number, required), 'int' (0..maximum,
    required), 'number?' (finite or null) or 'int?' (0..maximum or null). Returns its length."""
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
    if _column_is_valid(values, kind, maximum):
        return len(values)
    # Something is wrong (or unusual, like an int subclass): find the first offending value, one
    # at a time, to say which it is.
    if kind == "ts":
        bad = next((i for i, v in enumerate(values)
                    if not _is_number(v) or not 0 <= v <= MAX_TIMESTAMP), None)
        what = "a finite, non-negative Unix timestamp before year 9999"
    elif kind == "int":
        bad = next((i for i, v in enumerate(values) if not _is_int(v) or not 0 <= v <= maximum),
                   None)
        what = f"an integer from 0 to {maximum}"
    elif kind == "int?":
        bad = next((i for i, v in enumerate(values)
                    if v is not None and (not _is_int(v) or not 0 <= v <= maximum)), None)
        what = f"an integer from 0 to {maximum} or null"
    else:
        bad = next((i for i, v in enumerate(values) if v is not None
                    and (not _is_number(v) or not -MAX_NUMBER <= v <= MAX_NUMBER)), None)
        what = "a finite number or null"
    if bad is not None:
        raise ProtocolError(f"'{field}[{bad}]' must be {what} (got {values[bad]!r})", field)
    return len(values)


_NONE = type(None)
_TS_TYPES = frozenset({float, int})
_INT_TYPES = frozenset({int})
_OPTIONAL_INT_TYPES = frozenset({int, _NONE})
_OPTIONAL_NUMBER_TYPES = frozenset({float, int, _NONE})


def _column_is_valid(values: list, kind: str, maximum: int) -> bool:
    """The common case of _check_column in a few passes of C-level builtins over the whole column
    (types, a sum, min and max) instead of a Python test per value: a batch carries up to
    MAX_ROWS values per column, and the per-value loop was a third of the collectors' ingest time.
    True means valid; False means "look closer", never "invalid" by itself."""
    if not values:
        return True
    types = set(map(type, values))  # exact types: bool, an int subclass, is not int here
    # Nulls (and zeros, which are valid anyway) left out where the column may hold them.
    present = (lambda: filter(None, values)) if _NONE in types else (lambda: values)
    try:
        if kind == "ts":
            return (types <= _TS_TYPES and _all_finite(values, types)
                    and min(values) >= 0 and max(values) <= MAX_TIMESTAMP)
        if kind == "int":
            return types == _INT_TYPES and min(values) >= 0 and max(values) <= maximum
        if kind == "int?":
            return (types <= _OPTIONAL_INT_TYPES and min(present(), default=0) >= 0
                    and max(present(), default=0) <= maximum)
        if not types <= _OPTIONAL_NUMBER_TYPES or not _all_finite(present(), types):
            return False
        # A finite float is in range; an int may not be (it has no float beyond MAX_NUMBER).
        return int not in types or (min(present(), default=0) >= -MAX_NUMBER
                                    and max(present(), default=0) <= MAX_NUMBER)
    except (OverflowError, TypeError):  # an int too large for a float; incomparable values
        return False


def _all_finite(numbers, types: set) -> bool:
    # A NaN or an infinity anywhere makes the sum NaN or infinite. The converse can fail (finite
    # values whose sum overflows): then the caller looks value by value, which is exact.
    return float not in types or math.isfinite(sum(numbers))


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
        if not isinstance(name, str) or not _METRIC_NAME.fullmatch(name):
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
    _check_column(gpus["gpu"], "gpus.gpu", "int", length, maximum=MAX_GPU_INDEX)
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
        if not _is_number(ts) or not 0 <= ts <= MAX_TIMESTAMP:
            raise ProtocolError(f"'{field}.ts' must be a finite, non-negative Unix timestamp "
                                "before year 9999", f"{field}.ts")
        _check_json(event, field)


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
    # The type first: str() of a hostile value (a list nested thousands deep) would not return.
    if not isinstance(batch_id, str):
        raise ProtocolError("'batch_id' must be a UUID string", "batch_id")
    try:
        uuid.UUID(batch_id)
    except ValueError:
        raise ProtocolError("'batch_id' must be a UUID", "batch_id") from None

    run = _require_dict(batch.get("run"), "run")
    _require_str(run, "project", "run.project", _SLUG, max_len=MAX_PROJECT_CHARS)
    _require_str(run, "name", "run.name", max_len=MAX_RUN_NAME_CHARS)
    _require_int(run, "attempt", "run.attempt")
    config = run.setdefault("config", {})
    if not isinstance(config, dict):
        raise ProtocolError("'run.config' must be an object", "run.config")
    _check_json(config, "run.config")
    if len(repr(config)) > MAX_CONFIG_BYTES:
        raise ProtocolError(f"'run.config' must stay under {MAX_CONFIG_BYTES} bytes", "run.config")

    source = _require_dict(batch.get("source"), "source")
    _require_str(source, "host", "source.host", max_len=MAX_HOST_CHARS)
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
