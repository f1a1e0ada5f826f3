"""Downsampling a trace to at most N points without averaging its peaks away.

A chart of cluster power, temperature or throughput over a three-day run has hundreds of thousands
of points per trace; the browser needs a few thousand. A mean per bucket (or every n-th point)
would flatten exactly what the engineer is looking for — the 40-second power dip when every GPU
waited on a checkpoint, the one step that took a minute. So:

**Definition.** Points whose y is missing or not finite are dropped first (a chart would not draw
them). If at most ``max_points`` remain they are returned unchanged. Otherwise the x range
[x_first, x_last] is cut into ``max_points // 2`` buckets of equal width in x (time, when x is
time: a burst of dense samples does not get more of the budget than a quiet hour), and every
non-empty bucket contributes its lowest and its highest point — one point when they coincide —
in their original order. Hence:

- the output has at most ``max_points`` points, and is a subsequence of the input, so x stays in
  the input's (non-decreasing) order;
- every local extreme that is the minimum or maximum of its bucket survives, in particular the
  global minimum and maximum and any single-sample spike or dip larger than its neighbours;
- ties keep the earliest point for the minimum and the latest for the maximum.

``x`` may be numbers (Unix seconds, epoch milliseconds, step numbers) or datetimes (bucketed by
their timestamp); it must be non-decreasing — a ``ValueError`` says so otherwise. ``y`` may hold
``None``/NaN. Plain lists and NumPy arrays both work; results are plain lists of Python values,
ready for JSON.

``downsample_indices`` returns the kept positions instead, for callers that carry more than one
column per point (hover text, a second series on the same x). ``break_gaps`` inserts a ``None``
where consecutive points are further apart than a gap, so Plotly draws a break instead of a
straight line across, say, the downtime between two attempts.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import numpy as np

DEFAULT_MAX_POINTS = 2000


def downsample(
    x: Sequence[Any] | np.ndarray, y: Sequence[float | None] | np.ndarray,
    max_points: int = DEFAULT_MAX_POINTS,
) -> tuple[list[Any], list[float]]:
    """At most ``max_points`` points of (x, y) keeping every bucket's min and max (module doc)."""
    keep = downsample_indices(x, y, max_points)
    idx = keep.tolist()
    if isinstance(x, np.ndarray):
        xs = x[keep].tolist()
    else:
        xs = [x[i] for i in idx]
    ys = _as_float_array(y)[keep].tolist()
    return xs, ys


def downsample_indices(
    x: Sequence[Any] | np.ndarray, y: Sequence[float | None] | np.ndarray,
    max_points: int = DEFAULT_MAX_POINTS,
) -> np.ndarray:
    """Positions (ascending int array) of the points ``downsample`` keeps."""
    if max_points < 2:
        raise ValueError("max_points must be at least 2: one bucket keeps a minimum and a maximum.")
    xf = _x_as_float_array(x)
    yf = _as_float_array(y)
    if len(xf) != len(yf):
        raise ValueError(f"x and y must have the same length (got {len(xf)} and {len(yf)}).")
    valid = np.flatnonzero(np.isfinite(yf) & np.isfinite(xf))
    if len(valid) and np.any(np.diff(xf[valid]) < 0):
        raise ValueError("x must be in non-decreasing order; sort the points by x first.")
    if len(valid) <= max_points:
        return valid
    xv, yv = xf[valid], yf[valid]
    buckets = max_points // 2
    span = xv[-1] - xv[0]
    if span > 0:
        bucket = np.minimum(((xv - xv[0]) / span * buckets).astype(np.int64), buckets - 1)
    else:  # every point at one x: fall back to equal counts
        bucket = np.arange(len(xv)) * buckets // len(xv)
    # Sort by (bucket, y, position): the first of each bucket is its minimum (earliest on ties),
    # the last its maximum (latest on ties). Buckets are already in x order, so this is one pass.
    order = np.lexsort((np.arange(len(yv)), yv, bucket))
    sorted_bucket = bucket[order]
    boundaries = np.flatnonzero(np.diff(sorted_bucket)) + 1
    firsts = np.concatenate(([0], boundaries))
    lasts = np.concatenate((boundaries - 1, [len(order) - 1]))
    kept = np.union1d(order[firsts], order[lasts])
    return valid[kept]


def break_gaps(
    x: Sequence[float], y: Sequence[float | None], max_gap: float
) -> tuple[list[float | None], list[float | None]]:
    """(x, y) with a ``(x, None)`` point inserted wherever two consecutive x are more than
    ``max_gap`` apart, so a line chart shows the gap instead of bridging it. x must be numeric."""
    out_x: list[float | None] = []
    out_y: list[float | None] = []
    previous: float | None = None
    for xi, yi in zip(x, y, strict=True):
        if previous is not None and xi - previous > max_gap:
            out_x.append((previous + xi) / 2)
            out_y.append(None)
        out_x.append(xi)
        out_y.append(yi)
        previous = xi
    return out_x, out_y


def _as_float_array(values: Sequence[float | None] | np.ndarray) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype.kind == "f":
        return values.astype(np.float64, copy=False)
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def _x_as_float_array(values: Sequence[Any] | np.ndarray) -> np.ndarray:
    if isinstance(values, np.ndarray):
        if values.dtype.kind == "M":  # numpy datetime64
            return values.astype("datetime64[us]").astype(np.int64).astype(np.float64) / 1e6
        return values.astype(np.float64, copy=False)
    if len(values) and isinstance(values[0], datetime):
        return np.array([v.timestamp() for v in values], dtype=np.float64)
    return np.array(values, dtype=np.float64)
