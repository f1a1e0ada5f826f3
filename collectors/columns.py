"""Wire-format columns (validated lists) as numpy arrays, for the bulk write and the rollups.

Timestamps become int64 microseconds since the Unix epoch, rounded exactly as
``datetime.fromtimestamp`` rounds (the seconds' fraction times 1e6, half to even), so a row written
from these arrays holds the same microsecond as one written from a datetime, and the minute a
rollup files a row under is the minute of the stored timestamp.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MICROS_PER_MINUTE = 60_000_000


def epoch_micros(ts: Sequence[float]) -> np.ndarray:
    """Unix seconds (finite, >= 0, as validated) to int64 microseconds."""
    seconds = np.asarray(ts, dtype=np.float64)
    fraction, whole = np.modf(seconds)
    # CPython's fromtimestamp: modf, fraction * 1e6, round half to even (np.rint does the same).
    return whole.astype(np.int64) * 1_000_000 + np.rint(fraction * 1e6).astype(np.int64)


def floats(values: Sequence[float | None] | None, length: int) -> np.ndarray:
    """A float64 column; a null (or an absent column) is NaN. Validated wire numbers are finite,
    so NaN means exactly 'no value'."""
    if values is None:
        return np.full(length, np.nan)
    # numpy turns None into NaN when the dtype is float.
    return np.asarray(values, dtype=np.float64)


def ints(values: Sequence[int | None], length: int) -> np.ma.MaskedArray:
    """An int64 column with its nulls masked."""
    try:
        return np.ma.MaskedArray(np.asarray(values, dtype=np.int64), mask=False)
    except TypeError:  # a None in the column
        objects = np.asarray(values, dtype=object)
        missing = np.equal(objects, None)
        objects[missing] = 0
        return np.ma.MaskedArray(objects.astype(np.int64), mask=missing)
