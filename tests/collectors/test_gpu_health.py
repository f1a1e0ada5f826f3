"""GPU health: hottest and throttling GPUs, the heatmap, XID/ECC history per GPU."""

from __future__ import annotations

import pytest

from collectors.analysis import gpu_health
from collectors.analysis.gpu_health import GpuCell

T0 = 1_767_225_600.0


def cell(host, gpu, bucket, temp, power=600.0, samples=6, throttled=0, bits=0, temp_max=None):
    return GpuCell(host=host, gpu=gpu, bucket=T0 + bucket, samples=samples, temp_n=samples,
                   temp_sum=temp * samples, temp_max=temp_max if temp_max is not None else temp + 1,
                   power_n=samples, power_sum=power * samples, power_max=power + 20,
                   throttled=throttled, throttle_bits=bits)


def fleet(hot=("node1", 3), hot_extra=14.0, throttle=False):
    cells = []
    for host in ("node0", "node1", "node10", "node2"):
        for gpu in range(8):
            for bucket in (0, 600, 1200):
                extra = hot_extra if (host, gpu) == hot else 0.0
                cells.append(cell(host, gpu, bucket, 60.0 + gpu * 0.1 + extra,
                                  throttled=6 if throttle and extra else 0,
                                  bits=0x20 if throttle and extra else 0x1))
    return cells


def test_throttle_bits_decode_to_nvml_reason_names():
    assert gpu_health.decode_throttle(0) == []
    assert gpu_health.decode_throttle(0x24) == ["SW power cap", "SW thermal slowdown"]
    assert gpu_health.decode_throttle(0x1 | 0x1000) == ["GPU idle", "0x1000"]


def test_the_hot_gpu_tops_the_hottest_list_by_its_distance_from_the_fleet_median():
    summaries = gpu_health.gpu_summaries(fleet())
    assert len(summaries) == 32
    hottest = gpu_health.rank_hottest(summaries)
    assert hottest[0].name == "node1:3"
    # 31 GPUs at 60.0–60.7 °C, the hot one at 74.3 °C: the median (60.4 °C) ignores it.
    assert gpu_health.fleet_median_temp(summaries) == pytest.approx(60.4)
    assert hottest[0].above_median_c == pytest.approx(13.9)
    assert hottest[0].max_temp_c == pytest.approx(75.3)
    assert hottest[1].above_median_c == pytest.approx(0.3)


def test_hosts_sort_naturally():
    names = [s.name for s in gpu_health.gpu_summaries(fleet())]
    assert names[:9] == [f"node0:{g}" for g in range(8)] + ["node1:0"]
    assert names.index("node2:0") < names.index("node10:0")


def test_only_real_throttling_reasons_count_and_idle_does_not():
    summaries = gpu_health.gpu_summaries(fleet(throttle=True))
    throttling = gpu_health.rank_throttling(summaries)
    assert [s.name for s in throttling] == ["node1:3"]
    assert throttling[0].throttled_fraction == 1.0
    assert throttling[0].throttle_reasons == ["SW thermal slowdown"]
    # Idle bits on every GPU, no throttling anywhere: nobody is listed.
    idle_only = [cell("n", 0, 0, 50.0, throttled=6, bits=0x1)]
    assert gpu_health.rank_throttling(gpu_health.gpu_summaries(idle_only)) == []


def test_heatmap_is_gpus_by_buckets_with_empty_cells_and_two_orders():
    cells = fleet() + [cell("node0", 0, 2400, 99.0)]  # one GPU reports in a 5th bucket, 4th empty
    grid = gpu_health.heatmap(cells, 600)
    assert grid.buckets == [T0, T0 + 600, T0 + 1200, T0 + 1800, T0 + 2400]
    assert grid.gpus[0] == "node0:0" and len(grid.gpus) == 32
    assert grid.temp_c[0] == [60.0, 60.0, 60.0, None, 99.0]
    assert grid.power_w[0][0] == 600.0 and grid.temp_c[1][3] is None
    by_heat = gpu_health.heatmap(cells, 600, order="hottest")
    assert by_heat.gpus[0] == "node1:3"
    with pytest.raises(ValueError):
        gpu_health.heatmap(cells, 600, order="sideways")


def test_bucket_width_keeps_the_heatmap_under_its_column_budget():
    assert gpu_health.bucket_seconds(3 * 86_400, 300) == 900
    assert gpu_health.bucket_seconds(3600, 300) == 60
    assert 40 * 86_400 / gpu_health.bucket_seconds(40 * 86_400, 24) <= 24


def test_xid_and_ecc_events_are_counted_per_gpu_newest_first():
    events = [
        gpu_health.gpu_event(T0 + 10, "node1", "xid", {"gpu": 3, "xid": 79,
                                                      "description": "GPU has fallen off the bus"}),
        gpu_health.gpu_event(T0 + 20, "node1", "xid", {"gpu": 3, "xid": 48}),
        gpu_health.gpu_event(T0 + 30, "node1", "ecc", {"gpu": 3, "delta_dbe": 2, "delta_sbe": 0}),
        gpu_health.gpu_event(T0 + 40, "node2", "xid", {"gpu": 0, "xid": 13}),
        gpu_health.gpu_event(T0 + 50, "node2", "xid", {"xid": 31}),  # no GPU index
    ]
    assert events[0].detail == "GPU has fallen off the bus" and events[2].detail == "double-bit +2"
    rows = gpu_health.errors_per_gpu(events)
    assert [(r.name, r.xids, r.ecc, r.codes) for r in rows] == [
        ("node1:3", 2, 1, [48, 79]), ("node2", 1, 0, [31]), ("node2:0", 1, 0, [13])]


def test_malformed_payloads_do_not_break_the_history():
    weird = gpu_health.gpu_event(T0, "node0", "xid", {"gpu": "three", "xid": True})
    assert weird.gpu is None and weird.code is None
    assert gpu_health.gpu_event(T0, "node0", "ecc", None).detail == "ECC error count rose"
