"""GPU health's one-pass read (cluster_reads.gpu_health_rows: per-bucket means for the heatmap and
per-GPU totals for the summaries) against the cells it replaced, which test_rollups checks
against the raw samples."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest

from collectors import cluster_reads
from collectors.analysis import gpu_health
from collectors.models import Run
from collectors.tasks import ingest_batch
from tests.collectors.rollup_data import across_the_hour_batches, with_redeliveries


@pytest.fixture
def crossing_the_hour(token):
    rng = random.Random(5)
    batches = across_the_hour_batches(rng)
    assert sum(ingest_batch(copy.deepcopy(b), token=token)["stored"]
               for b in with_redeliveries(rng, batches)) == len(batches)
    return Run.objects.get(name="run-h")


# 2 min and 10 min read GpuMinute; 1 h and 2 h read GpuHour.
@pytest.mark.parametrize("bucket_s", [120, 600, 3600, 7200])
def test_heatmap_means_and_gpu_totals_equal_those_of_the_cells(crossing_the_hour, bucket_s):
    cells = cluster_reads.gpu_cells(crossing_the_hour, bucket_s)

    means, totals = cluster_reads.gpu_health_rows(crossing_the_hour, bucket_s)

    expected = gpu_health.means_of_cells(cells)
    assert means.keys() == expected.keys() and len(means) == 8
    for key, m in means.items():
        order = np.argsort(m.bucket)
        e = expected[key]
        e_order = np.argsort(e.bucket)
        assert m.bucket[order].tolist() == e.bucket[e_order].tolist()
        for column in ("temp_c", "power_w"):
            np.testing.assert_allclose(getattr(m, column)[order], getattr(e, column)[e_order],
                                       rtol=1e-12)
    summaries, from_cells = gpu_health.gpu_summaries(totals), gpu_health.gpu_summaries(cells)
    assert [(s.name, s.samples, s.max_temp_c, s.max_power_w, s.throttled_samples,
             s.throttle_bits) for s in summaries] == [
        (s.name, s.samples, s.max_temp_c, s.max_power_w, s.throttled_samples, s.throttle_bits)
        for s in from_cells]
    assert [s.mean_temp_c for s in summaries] == pytest.approx([s.mean_temp_c for s in from_cells])
    assert any(s.throttled_samples for s in summaries)
    for order in ("name", "hottest"):
        assert gpu_health.heatmap_of_means(means, bucket_s, order=order, summaries=summaries) == \
            gpu_health.heatmap(cells, bucket_s, order=order)
