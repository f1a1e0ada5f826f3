"""The Power and GPU health pages: a planted checkpoint dip, a hot throttling GPU with XIDs, access
rules, bad input, and the numbers on the page equal to what the analyses return."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from django.test import Client

from collectors import rollups
from collectors.models import Checkpoint, Event, GpuSample, Run, StepMetric
from dashboard.charts import MAX_POINTS_PER_TRACE
from dashboard.views import cluster_presenters
from tests.dashboard.conftest import make_run

START = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
SECONDS = 1200
HOSTS = ("node001", "node002")
DIP_AT, RECOVER_AT = 600, 660  # every GPU idles for the checkpoint save in between
HOT = ("node002", 3)


def planted_cluster(run: Run, attempt) -> None:
    """16 GPUs sampled at 1 Hz for 20 min at ~700 W, falling to 100 W over 5 s at DIP_AT (a
    checkpoint save, reported at its end) and back at RECOVER_AT: -9.6 kW, then +9.6 kW. One GPU
    runs 15 °C hot and thermally throttles; it also reported two XIDs and an ECC rise."""
    rng = np.random.default_rng(5)
    rows = []
    for h, host in enumerate(HOSTS):
        for gpu in range(8):
            hot = (host, gpu) == HOT
            offset = (h * 8 + gpu) % 5 + 1
            for s in range(SECONDS):
                idle = DIP_AT + offset <= s < RECOVER_AT + offset
                rows.append(GpuSample(
                    run=run, attempt=attempt, host=host, gpu=gpu, ts=START + timedelta(seconds=s),
                    temp_c=(45.0 if idle else 65.0) + (15.0 if hot else 0.0) + rng.normal(0, 0.5),
                    power_w=(100.0 if idle else 700.0) + rng.normal(0, 3.0),
                    util_pct=0.0 if idle else 99.0, mem_used_mb=60000.0,
                    sm_clock_mhz=1700.0 if hot else 1980.0,
                    throttle=0x1 if idle else (0x20 if hot else 0)))
    GpuSample.objects.bulk_create(rows, batch_size=10000)
    steps = [s for s in range(0, SECONDS, 6) if not DIP_AT <= s < RECOVER_AT]
    StepMetric.objects.bulk_create([
        StepMetric(run=run, attempt=attempt, rank=0, step=i, ts=START + timedelta(seconds=s),
                   duration_s=6.0) for i, s in enumerate(steps)])
    for rank in range(16):
        Checkpoint.objects.create(run=run, attempt=attempt, rank=rank, kind=Checkpoint.Kind.SAVE,
                                  step=150, ts=START + timedelta(seconds=RECOVER_AT),
                                  duration_s=float(RECOVER_AT - DIP_AT), bytes=10**9)
    for when, kind, payload in (
        (300, "xid", {"gpu": 3, "xid": 48, "description": "Double-bit ECC error"}),
        (301, "ecc", {"gpu": 3, "delta_dbe": 1, "delta_sbe": 0}),
        (1000, "xid", {"gpu": 3, "xid": 63}),
    ):
        Event.objects.create(run=run, attempt=attempt, rank=11, host="node002", kind=kind,
                             ts=START + timedelta(seconds=when), payload=payload)
    rollups.rebuild(run.pk)


@pytest.fixture
def cluster_run(projects) -> Run:
    run, (attempt,) = make_run(projects["llm"], "cluster-16", world_size=16)
    attempt.started_at = START
    attempt.save()
    planted_cluster(run, attempt)
    return run


def _json(response) -> dict:
    assert response.status_code == 200, response.content[:300]
    return json.loads(response.content)


def test_power_page_lists_the_checkpoint_dip_with_size_rate_and_cause(clients, cluster_run):
    response = clients["member"].get(f"/runs/{cluster_run.pk}/power/")
    assert response.status_code == 200
    body = response.content.decode()
    assert 'class="active" aria-current="page">Power<' in body
    rows = response.context["swings"]
    assert len(rows) == 2
    fall = next(r for r in rows if r["direction"] == "fall")
    assert fall["delta_kw"] == pytest.approx(-9.6, abs=0.15)
    assert fall["rate_kw_s"] == pytest.approx(-9.6 / 5, abs=0.1)
    assert fall["cause"] == "checkpoint"
    assert "checkpoint save of step 150" in fall["coincided"]
    rise = next(r for r in rows if r["direction"] == "rise")
    assert rise["delta_kw"] == pytest.approx(9.6, abs=0.15) and rise["cause"] == "checkpoint"
    assert fall["delta"] in body and "checkpoint save of step 150" in body
    assert response.context["summary"]["largest_fall"] == f"{fall['delta_kw']:+,.1f} kW"


def test_power_page_numbers_are_the_analysis_numbers(clients, cluster_run):
    page = _json(clients["owner"].get(f"/runs/{cluster_run.pk}/power.json"))
    view = cluster_presenters.power_view(cluster_run)
    assert [r["delta_kw"] for r in page["swings"]] == [round(s.delta_kw, 1) for s in view.swings]
    assert [r["start_epoch"] for r in page["swings"]] == [round(s.start, 3) for s in view.swings]
    assert page["method"]["per_minute"] is False and page["method"]["stale"] == "3 s"
    line = page["figures"]["power"]["data"][0]
    assert len(line["x"]) <= MAX_POINTS_PER_TRACE + 10  # + gap breaks
    # The dip survives downsampling at its full depth.
    assert min(v for v in line["y"] if v is not None) == pytest.approx(1.6, abs=0.1)
    markers = [t for t in page["figures"]["power"]["data"] if t["mode"] == "markers"]
    assert [t["name"] for t in markers] == ["swing: checkpoint"]


def test_long_ranges_refine_only_candidate_regions_and_find_the_same_swings(
        clients, cluster_run, monkeypatch):
    per_second = cluster_presenters.power_view(cluster_run)
    monkeypatch.setattr(cluster_presenters, "RAW_SAMPLES_LIMIT", 1000)
    page = _json(clients["owner"].get(f"/runs/{cluster_run.pk}/power.json"))
    assert page["method"]["per_minute"] is True
    assert [r["delta_kw"] for r in page["swings"]] == [round(s.delta_kw, 1)
                                                       for s in per_second.swings]
    assert [r["cause"] for r in page["swings"]] == ["checkpoint", "checkpoint"]
    names = [t["name"] for t in page["figures"]["power"]["data"]]
    assert names[:2] == ["cluster power (mean per minute)", "per second around swings"]


def test_zooming_in_reads_the_range_per_second(clients, cluster_run):
    start = (START + timedelta(seconds=550)).timestamp()
    page = _json(clients["owner"].get(f"/runs/{cluster_run.pk}/power.json",
                                      {"start": f"{start:.0f}", "end": f"{start + 200:.0f}"}))
    xs = page["figures"]["power"]["data"][0]["x"]
    assert xs[0] == start * 1000 and len(xs) == 201  # every second of the range
    iso = _json(clients["owner"].get(f"/runs/{cluster_run.pk}/power.json",
                                     {"start": "2026-03-02T12:09:10", "end": "2026-03-02T12:12:30"}))
    assert iso["figures"]["power"]["data"][0]["x"][0] == start * 1000


BAD_RANGES = [
    ({"start": "yesterday"}, "'start' must be Unix seconds or an ISO 8601 time"),
    ({"start": "200", "end": "100"}, "'end' must be after 'start'"),
    ({"end": "nan"}, "'end' must be a finite time"),
]


def test_a_bad_range_is_a_400_that_says_what_to_send(clients, cluster_run):
    for query, message in BAD_RANGES:
        page = clients["owner"].get(f"/runs/{cluster_run.pk}/power/", query)
        assert page.status_code == 400 and message in page.content.decode()
        endpoint = clients["owner"].get(f"/runs/{cluster_run.pk}/power.json", query)
        assert endpoint.status_code == 400 and message in endpoint.json()["error"]


def test_gpu_health_names_the_hot_throttling_gpu_and_its_errors(clients, cluster_run):
    response = clients["member"].get(f"/runs/{cluster_run.pk}/gpus/")
    assert response.status_code == 200
    context = response.context
    assert context["gpus"] == 16
    assert context["hottest"][0]["name"] == "node002:3"
    assert float(context["hottest"][0]["above"]) == pytest.approx(15.0, abs=0.5)
    assert [g["name"] for g in context["throttling"]] == ["node002:3"]
    assert context["throttling"][0]["reasons"] == "SW thermal slowdown"
    # Throttled whenever it trained: 1,140 of 1,200 samples. Idle minutes do not count; the two
    # minutes that mix idle and throttled samples count whole while the rollup counts any bit
    # (collectors.analysis.gpu_health), so the page may say up to 100%.
    fraction = context["throttling"][0]["fraction"]
    assert 95.0 <= float(fraction.rstrip("%")) <= 100.0
    view = cluster_presenters.gpu_health_view(cluster_run)
    assert fraction == f"{100 * view.throttling[0].throttled_fraction:.1f}%"
    assert [(r["name"], r["xids"], r["ecc"], r["codes"]) for r in context["errors"]] == [
        ("node002:3", 2, 1, "48, 63")]
    assert [e["kind"] for e in context["events"]] == ["XID", "ECC", "XID"]
    body = response.content.decode()
    assert "node002:3" in body and "Double-bit ECC error" in body


def test_gpu_heatmaps_are_gpus_by_time_in_either_order(clients, cluster_run):
    by_name = _json(clients["owner"].get(f"/runs/{cluster_run.pk}/gpus.json"))
    temp = by_name["figures"]["temp"]["data"][0]
    assert temp["type"] == "heatmap" and temp["y"][0] == "node001:0" and len(temp["y"]) == 16
    assert len(temp["x"]) == 20  # one-minute buckets over 20 minutes
    assert temp["z"][temp["y"].index("node002:3")][0] == pytest.approx(80.0, abs=0.5)
    hottest = _json(clients["owner"].get(f"/runs/{cluster_run.pk}/gpus.json", {"order": "hottest"}))
    assert hottest["figures"]["temp"]["data"][0]["y"][0] == "node002:3"
    assert hottest["figures"]["power"]["data"][0]["type"] == "heatmap"
    bad = clients["owner"].get(f"/runs/{cluster_run.pk}/gpus/", {"order": "coolest"})
    assert bad.status_code == 400 and "'order' must be" in bad.content.decode()


def test_another_projects_run_is_a_404_and_anonymous_users_go_to_login(clients, cluster_run):
    for path in ("power/", "power.json", "gpus/", "gpus.json"):
        assert clients["outsider"].get(f"/runs/{cluster_run.pk}/{path}").status_code == 404
        assert clients["admin"].get(f"/runs/{cluster_run.pk}/{path}").status_code == 200
        anonymous = Client().get(f"/runs/{cluster_run.pk}/{path}")
        assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")


def test_a_run_without_gpu_telemetry_says_so(clients, projects):
    run, _ = make_run(projects["llm"], "no-gpus")
    for path, text in (("power/", "No GPU power samples"), ("gpus/", "No GPU telemetry")):
        response = clients["owner"].get(f"/runs/{run.pk}/{path}")
        assert response.status_code == 200 and text in response.content.decode()
    assert _json(clients["owner"].get(f"/runs/{run.pk}/power.json")) == {"empty": True}
