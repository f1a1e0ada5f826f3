"""Between the wire format's Unix seconds and the database's aware datetimes."""

from __future__ import annotations

from datetime import UTC, datetime


def from_epoch(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def to_epoch(ts: datetime | None) -> float | None:
    return ts.timestamp() if ts is not None else None
