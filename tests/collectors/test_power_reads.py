"""The Power page's raw sample read (collectors.cluster_reads.raw_power_windows: every window in one
statement) against the stored rows of each window."""

from __future__ import annotations

import copy
import random

import numpy as np

from collectors import cluster_reads
from collectors.models import GpuSample, Run
from collectors.tasks import ingest_batch
from tests.collectors.rollup_data import T0, random_batches


def stored_window(run: Run, start: float, end: float) -> list[tuple]:
    return sorted((round(s.ts.timestamp(), 6), s.host, s.gpu, s.power_w)
                  for s in GpuSample.objects.filter(run=run, power_w__isnull=False)
                  if start <= s.ts.timestamp() <= end)


def test_each_window_holds_exactly_its_samples_empty_and_overlapping_ones_too(token):
    for b in random_batches(random.Random(5)):
        ingest_batch(copy.deepcopy(b), token=token)
    run = Run.objects.get(name="run-1")
    windows = [(T0 + 10, T0 + 70.5), (T0 + 60, T0 + 130), (T0 + 5000, T0 + 5100),
               (T0 - 100, T0 + 400)]

    found = cluster_reads.raw_power_windows(run, windows)

    assert len(found) == len(windows)
    for (start, end), raw in zip(windows, found, strict=True):
        expected = stored_window(run, start, end)
        assert len(raw.ts) == len(raw.gpu) == len(raw.power_w) == len(expected)
        # (host, gpu) pairs come back as one integer id each: as many ids as pairs, and each
        # id's samples are that pair's.
        pairs = {(host, gpu) for _, host, gpu, _ in expected}
        assert len(set(raw.gpu.tolist())) == len(pairs)
        by_id: dict[int, list] = {}
        for t, key, watts in zip(raw.ts, raw.gpu, raw.power_w, strict=True):
            by_id.setdefault(int(key), []).append((round(float(t), 6), float(watts)))
        by_pair: dict[tuple, list] = {}
        for t, host, gpu, watts in expected:
            by_pair.setdefault((host, gpu), []).append((t, watts))
        assert sorted(sorted(v) for v in by_id.values()) == sorted(sorted(v)
                                                                   for v in by_pair.values())
    assert len(found[2].ts) == 0 and found[2].ts.dtype == np.float64
    assert len(found[3].ts) == len(stored_window(run, *windows[3])) > len(found[0].ts)


def test_one_window_read_is_the_same_as_raw_power(token):
    for b in random_batches(random.Random(6)):
        ingest_batch(copy.deepcopy(b), token=token)
    run = Run.objects.get(name="run-1")

    one = cluster_reads.raw_power(run, T0 + 20, T0 + 90)
    (same,) = cluster_reads.raw_power_windows(run, [(T0 + 20, T0 + 90)])

    assert np.array_equal(one.ts, same.ts) and np.array_equal(one.gpu, same.gpu)
    assert np.array_equal(one.power_w, same.power_w)
    assert cluster_reads.raw_power_windows(run, []) == []


def test_step_times_find_each_attempts_newest_and_oldest_step_within_bounds(token):
    from datetime import UTC, datetime

    from collectors.models import Attempt
    from tests.batches import step_batch

    ingest_batch(step_batch(attempt=0, first_step=0, count=10, t0=T0), token=token)
    ingest_batch(step_batch(attempt=1, first_step=5, count=10, t0=T0 + 100), token=token)
    run = Run.objects.get(name="run-1")
    first, second = (Attempt.objects.get(run=run, number=n).pk for n in (0, 1))

    def at(t: float) -> datetime:
        return datetime.fromtimestamp(t, tz=UTC)

    lookups = [
        cluster_reads.StepLookup(first, None, at(T0 + 5.5), newest=True),   # step at T0 + 5
        cluster_reads.StepLookup(first, at(T0 + 2), None, newest=False),    # step at T0 + 2
        cluster_reads.StepLookup(second, at(T0 + 103.5), at(T0 + 150), newest=False),
        cluster_reads.StepLookup(second, None, at(T0 + 99), newest=True),   # none before it
        cluster_reads.StepLookup(first, at(T0 + 100), None, newest=True),   # none after its end
    ]

    assert cluster_reads.step_times(run, lookups) == [
        at(T0 + 5), at(T0 + 2), at(T0 + 104), None, None]
    assert cluster_reads.step_times(run, []) == []
