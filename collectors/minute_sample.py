"""Which minutes of a long run the whole-run analyses (time of day, stragglers) read from a rollup.

A 512-GPU run has 512 GpuMinute rows a minute, 3.7M in 5 days; scanning them all cannot answer a
page in under a second. Up to ``ROW_BUDGET`` rows the analyses read every minute (exact); past it
they read a systematic sample, every k-th minute from the first, through the rollups'
(run, minute, …) unique index. Temperature, slowdowns and stragglers change over hours and persist
for days, so every k-th minute (k is 2–30 at these sizes) leaves each hour of the day with dozens
of minutes; the pages say when they sampled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db.models import Count, Max, Min

ROW_BUDGET = 100_000
PROBES = 7


def _rows_per_minute(queryset, minutes: Sequence[datetime]) -> int:
    """The most rows any of a few evenly spread minutes holds (GPUs or ranks reporting)."""
    if not minutes:
        return 0
    step = max(1, len(minutes) // PROBES)
    probes = list(minutes[::step][:PROBES]) + [minutes[-1]]
    counts = (queryset.filter(minute__in=probes).values("minute").annotate(n=Count("*"))
              .values_list("n", flat=True))
    return max(counts, default=0)


def thin(queryset, minutes: Sequence[datetime], budget: int | None = None) -> tuple[list, int]:
    """``minutes`` (in order) cut to every k-th so that about ``budget`` (default ROW_BUDGET) rows
    are read; returns the minutes and k (1: all of them)."""
    budget = budget or ROW_BUDGET
    per_minute = _rows_per_minute(queryset, minutes)
    every = max(1, math.ceil(len(minutes) * per_minute / budget)) if per_minute else 1
    return list(minutes[::every]), every


def sampled_minutes(queryset, budget: int | None = None) -> tuple[list[datetime] | None, int]:
    """The minutes to read from ``queryset`` (one run's rollup rows): None and 1 when the whole run
    fits the budget, else every k-th minute of its span and k."""
    span = queryset.aggregate(first=Min("minute"), last=Max("minute"))
    if span["first"] is None:
        return None, 1
    count = int((span["last"] - span["first"]).total_seconds() // 60) + 1
    minutes = [span["first"] + timedelta(minutes=i) for i in range(count)]
    sample, every = thin(queryset, minutes, budget)
    return (None, 1) if every == 1 else (sample, every)
