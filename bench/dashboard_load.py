"""Every dashboard page and JSON chart endpoint of a run with 20 million GPU samples and a million
step rows: p50/p95 per URL and the largest trace each chart sends. One command:

    make bench-dashboard                         # load (or reuse) the run, then measure
    .venv/bin/python bench/dashboard_load.py --quick            # a ~2M-sample run, for development
    .venv/bin/python bench/dashboard_load.py --reuse            # measure again without reloading

What it does, in order:
1. creates a dedicated database (``--db``, default runwatch_bench_dash, on the server of
   DATABASE_URL or 127.0.0.1:5432) and migrates it; with ``--reuse`` an already-loaded database
   whose run has the requested shape is kept as it is;
2. loads one run by binary COPY of generated rows (NumPy builds the COPY stream column-wise; each
   day is written into its own partition before it is attached): by default 512 GPUs on 64 hosts
   sampled every 10 s for 4.6 days (20.3M samples) and ranks 0-63 logging a step every 24 s
   (1.06M step rows), with a day/night temperature cycle, 5 interruptions and restarts (their
   downtime leaves gaps), a checkpoint every 30 minutes (power drops while it blocks), a few
   hot and throttling GPUs, two slow ranks and rare loss spikes;
3. builds the per-minute rollups with collectors.rollups.rebuild (what `manage.py
   rebuild_rollups` runs), then VACUUM ANALYZE;
4. serves the real app with gunicorn (DEBUG off, 2 workers, a free port), signs in as a project
   member, and requests the runs list and every GET URL of dashboard/views/urls.py that takes
   only a run id (so pages added later are measured too), ``--requests`` times each after one
   warm-up request, printing p50/p95/max and, for pages and JSON that carry Plotly figures, the
   largest number of points in one trace (x/y/z array lengths; a heatmap counts its longest row).

Exits 1 if any p95 reaches 500 ms or any trace exceeds 5,000 points; 2 if a URL answers an error.
Timings on a shared 2-core machine are noisy: compare runs made on the same machine state.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from _pages import (
    ROOT,
    create_database,
    drop_database,
    log,
    member_client,
    open_database,
    vacuum_analyze,
)

P95_LIMIT_MS = 500.0
POINTS_LIMIT = 5000
# Bump when the generated shape changes, so --reuse reloads instead of measuring stale data.
SHAPE_VERSION = 2
PG_EPOCH_US = 946_684_800 * 1_000_000  # 2000-01-01 in Unix microseconds


@dataclass(frozen=True)
class Shape:
    hosts: int = 64
    gpus_per_host: int = 8
    days: float = 4.6
    sample_interval_s: float = 10.0
    step_ranks: int = 64
    step_time_s: float = 24.0
    interruptions: int = 5
    checkpoint_every_s: float = 1800.0

    @property
    def gpus(self) -> int:
        return self.hosts * self.gpus_per_host


QUICK = Shape(hosts=16, days=1.5, step_ranks=32, step_time_s=12.0, interruptions=3)


# --- generated run ----------------------------------------------------------------------------

@dataclass
class Plan:
    """When things happen in the generated run, in Unix seconds."""

    start: float
    end: float
    outages: list[tuple[float, float]]  # (interruption, next attempt's first step)
    categories: list[str]

    def attempt_bounds(self) -> list[tuple[float, float]]:
        bounds, begin = [], self.start
        for down, up in self.outages:
            bounds.append((begin, down))
            begin = up
        bounds.append((begin, self.end))
        return bounds


def make_plan(shape: Shape) -> Plan:
    end = float(int(time.time()) // 60 * 60)
    start = end - shape.days * 86400
    rng = np.random.default_rng(7)
    cuts = np.sort(rng.uniform(start + 3600, end - 3600, shape.interruptions))
    downtime = rng.uniform(600, 1800, shape.interruptions)
    categories = ["gpu_hardware", "nccl_timeout", "gpu_memory", "network", "host",
                  "software_bug", "storage"]
    return Plan(start=start, end=end,
                outages=[(float(c), float(c + d)) for c, d in zip(cuts, downtime, strict=True)],
                categories=[categories[i % len(categories)] for i in range(shape.interruptions)])


def _up(times: np.ndarray, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Which times fall inside an attempt, and that attempt's index."""
    attempt = np.searchsorted([down for down, _ in plan.outages], times, side="right")
    up = np.ones(times.shape, dtype=bool)
    for down, back in plan.outages:
        up &= ~((times >= down) & (times < back))
    return up, attempt


def _checkpointing(times: np.ndarray, plan: Plan, shape: Shape) -> np.ndarray:
    return ((times - plan.start) % shape.checkpoint_every_s) < 40.0


def _record(fields: list[tuple[str, str]]) -> np.dtype:
    """A binary COPY row: int16 field count, then per field an int32 length and the value."""
    layout = [("count", ">i2")]
    for name, kind in fields:
        layout += [(f"{name}_len", ">i4"), (name, kind)]
    return np.dtype(layout)


GPU_FIELDS = [("id", ">i8"), ("run_id", ">i8"), ("attempt_id", ">i8"), ("host", "S7"), ("gpu", ">i2"),
              ("ts", ">i8"), ("temp_c", ">f8"), ("power_w", ">f8"), ("util_pct", ">f8"),
              ("mem_used_mb", ">f8"), ("sm_clock_mhz", ">f8"), ("throttle", ">i8"),
              ("simulated", "u1")]
STEP_FIELDS = [("id", ">i8"), ("run_id", ">i8"), ("attempt_id", ">i8"), ("rank", ">i4"), ("step", ">i8"),
               ("ts", ">i8"), ("duration_s", ">f8"), ("tokens", ">i8"), ("loss", ">f8"),
               ("lr", ">f8"), ("grad_norm", ">f8"), ("extra", "S3")]
COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + (0).to_bytes(4, "big") * 2
COPY_TRAILER = (-1).to_bytes(2, "big", signed=True)


def _fill(dtype: np.dtype, fields, n: int, values: dict) -> np.ndarray:
    rows = np.empty(n, dtype=dtype)
    rows["count"] = len(fields)
    for name, _ in fields:
        rows[f"{name}_len"] = dtype[name].itemsize
        rows[name] = values.get(name, 0)  # ids are given when the rows are written
    return rows


def gpu_rows(day_start: float, day_end: float, plan: Plan, shape: Shape, run_id: int,
             attempt_ids: list[int]) -> np.ndarray:
    ticks = np.arange(np.ceil((day_start - plan.start) / shape.sample_interval_s),
                      np.ceil((day_end - plan.start) / shape.sample_interval_s))
    times = plan.start + ticks * shape.sample_interval_s
    times = times[(times >= max(day_start, plan.start)) & (times < min(day_end, plan.end))]
    up, attempt = _up(times, plan)
    times, attempt = times[up], attempt[up]
    gpus = shape.gpus
    n = len(times) * gpus
    t = np.repeat(times, gpus)
    g = np.tile(np.arange(gpus), len(times))
    rng = np.random.default_rng(int(day_start))
    hour = (t / 3600.0 - 6.0) % 24.0  # site day peaks mid-afternoon (UTC-6)
    diurnal = np.sin((hour - 9.0) / 24.0 * 2 * np.pi)
    hot = (g % 97) == 13  # a handful of GPUs run hot and throttle
    checkpoint = np.repeat(_checkpointing(times, plan, shape), gpus)
    temp = 62 + 5 * diurnal + 0.03 * (g % 50) + rng.normal(0, 0.8, n) + 9 * hot - 6 * checkpoint
    power = np.where(checkpoint, 180.0, 640.0) + 12 * diurnal + rng.normal(0, 15, n)
    hosts = np.array([f"node{h:03d}".encode() for h in range(shape.hosts)], dtype="S7")
    return _fill(_record(GPU_FIELDS), GPU_FIELDS, n, {
        "run_id": run_id, "attempt_id": np.asarray(attempt_ids)[np.repeat(attempt, gpus)],
        "host": hosts[g // shape.gpus_per_host], "gpu": g % shape.gpus_per_host,
        "ts": (t * 1e6).astype(np.int64) - PG_EPOCH_US, "temp_c": temp, "power_w": power,
        "util_pct": np.where(checkpoint, 3.0, 98.0), "mem_used_mb": 71_000.0,
        "sm_clock_mhz": np.where(hot & (temp > 75), 1410.0, 1980.0),
        "throttle": np.where(hot & (temp > 75), 0x20, 0), "simulated": 1,
    })


def step_times(plan: Plan, shape: Shape) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The job's steps: end time, step number and attempt index, lockstep across ranks. A restart
    resumes from the last checkpoint's step, as a real job does."""
    times, steps, attempts = [], [], []
    step = 0
    per_checkpoint = max(1, int(shape.checkpoint_every_s / shape.step_time_s))
    for index, (begin, finish) in enumerate(plan.attempt_bounds()):
        count = int((finish - begin - 120) / shape.step_time_s)
        ends = begin + 120 + shape.step_time_s * np.arange(1, count + 1)
        times.append(ends)
        steps.append(step + np.arange(count))
        attempts.append(np.full(count, index))
        step = step + (count // per_checkpoint) * per_checkpoint  # lost since the last save
    return np.concatenate(times), np.concatenate(steps), np.concatenate(attempts)


def step_rows(plan: Plan, shape: Shape, run_id: int, attempt_ids: list[int]) -> np.ndarray:
    times, steps, attempts = step_times(plan, shape)
    ranks = shape.step_ranks
    n = len(times) * ranks
    rng = np.random.default_rng(11)
    t = np.repeat(times, ranks)
    r = np.tile(np.arange(ranks), len(times))
    s = np.repeat(steps, ranks)
    hour = (t / 3600.0 - 6.0) % 24.0
    slow = np.isin(r, [17, 42]) * 0.06
    duration = shape.step_time_s * (1 + 0.0075 * np.sin((hour - 9.0) / 24.0 * 2 * np.pi)
                                    + slow + rng.normal(0, 0.01, n))
    loss = 2.2 * np.exp(-s / 20_000.0) + 1.6 + rng.normal(0, 0.02, n)
    loss[rng.random(n) < 2e-5] += 3.0  # rare spikes the chart must not average away
    return _fill(_record(STEP_FIELDS), STEP_FIELDS, n, {
        "run_id": run_id, "attempt_id": np.asarray(attempt_ids)[np.repeat(attempts, ranks)],
        "rank": r, "step": s, "ts": (t * 1e6).astype(np.int64) - PG_EPOCH_US,
        "duration_s": duration, "tokens": 4_194_304 // ranks, "loss": loss, "lr": 1.5e-4,
        "grad_norm": np.abs(rng.normal(1.0, 0.1, n)), "extra": b"\x01{}",
    })


def copy_rows(conn, table: str, columns: list[str], rows: np.ndarray) -> None:
    names = ", ".join(f'"{c}"' for c in columns)
    chunk = 500_000
    with conn.cursor() as cursor, cursor.copy(
            f'COPY "{table}" ({names}) FROM STDIN (FORMAT BINARY)') as copy:
        copy.write(COPY_HEADER)
        for i in range(0, len(rows), chunk):
            copy.write(rows[i:i + chunk].tobytes())
        copy.write(COPY_TRAILER)


def load_days(url: str, parent: str, days: list[int], make_rows, columns: list[str]) -> int:
    """Each day's rows into a plain table, then attached as that day's partition: no index is
    maintained row by row, and PostgreSQL builds each day's indexes once, at ATTACH."""
    import psycopg

    from collectors import partitions

    total = 0
    spent = {"waiting for rows": 0.0, "copy": 0.0, "attach": 0.0}
    # The next day's rows are generated (NumPy, mostly outside the GIL) while this day's COPY
    # and index builds run in PostgreSQL.
    with psycopg.connect(url, autocommit=True) as conn, ThreadPoolExecutor(1) as ahead:
        # The index builds at ATTACH sort a day of rows: in memory rather than in temp files.
        conn.execute("SET maintenance_work_mem = '512MB'")
        pending = [ahead.submit(make_rows, day) for day in days[:1]]
        for index, day in enumerate(days):
            clock = time.perf_counter()
            rows = pending.pop(0).result()
            if index + 1 < len(days):
                pending.append(ahead.submit(make_rows, days[index + 1]))
            spent["waiting for rows"] += time.perf_counter() - clock
            if not len(rows):
                continue
            name = partitions.partition_name(parent, day)
            start, end = partitions.day_start(day), partitions.day_start(day + 1)
            conn.execute(f'DROP TABLE IF EXISTS "{name}"')
            conn.execute(f'CREATE TABLE "{name}" (LIKE "{parent}" INCLUDING DEFAULTS '
                         f"INCLUDING CONSTRAINTS)")
            # Ids from the parent's identity sequence, reserved as one block (a sequence call
            # per row would cost more than the COPY).
            first = conn.execute(
                "SELECT nextval(pg_get_serial_sequence(%s, 'id'))", [parent]).fetchone()[0]
            conn.execute("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s)",
                         [parent, first + len(rows) - 1])
            rows["id"] = np.arange(first, first + len(rows))
            clock = time.perf_counter()
            copy_rows(conn, name, columns, rows)
            spent["copy"] += time.perf_counter() - clock
            clock = time.perf_counter()
            conn.execute(f'ALTER TABLE "{parent}" ATTACH PARTITION "{name}" FOR VALUES '
                         f"FROM ('{start.isoformat()}') TO ('{end.isoformat()}')")
            spent["attach"] += time.perf_counter() - clock
            total += len(rows)
    log(f"{parent}: {total:,} rows; " + ", ".join(f"{k} {v:.0f} s" for k, v in spent.items()))
    return total


def load(url: str, shape: Shape) -> int:
    from django.contrib.auth import get_user_model
    from django.db import connection

    from collectors import partitions, rollups
    from collectors.models import (
        Attempt,
        Checkpoint,
        Event,
        GpuSample,
        Interruption,
        Project,
        Run,
        StepMetric,
    )

    plan = make_plan(shape)
    project = Project.objects.create(slug="bench", name="Dashboard benchmark")
    user = get_user_model().objects.create_user("bench", password=None)
    project.members.add(user)
    when = lambda seconds: datetime.fromtimestamp(seconds, tz=UTC)  # noqa: E731
    run = Run.objects.create(
        project=project, name=f"llama-{shape.gpus}gpu", world_size=shape.gpus,
        timezone="America/Chicago", first_seen_at=when(plan.start), last_seen_at=when(plan.end),
        config={"bench": {"version": SHAPE_VERSION, **shape.__dict__}, "model": "llama-70b"})
    attempts = [Attempt.objects.create(run=run, number=i, started_at=when(begin),
                                       ended_at=when(finish))
                for i, (begin, finish) in enumerate(plan.attempt_bounds())]
    attempt_ids = [a.pk for a in attempts]
    # Plenty of other runs: the runs list must stay fast with many of them.
    Run.objects.bulk_create([Run(project=project, name=f"sweep-{i:03d}", world_size=8,
                                 status=Run.Status.FINISHED) for i in range(200)])

    for index, ((down, _), category) in enumerate(zip(plan.outages, plan.categories,
                                                      strict=True)):
        event = Event.objects.create(run=run, attempt=attempts[index], rank=0, host="node000",
                                     kind="interruption", ts=when(down),
                                     payload={"reason": category})
        Interruption.objects.create(run=run, attempt=attempts[index], event=event, ts=when(down),
                                    rank=0, host="node000", source="exception",
                                    category=category, confidence=0.9, rule="bench")
    times, steps, attempt_of = step_times(plan, shape)
    per_checkpoint = max(1, int(shape.checkpoint_every_s / shape.step_time_s))
    saves = [i for i in range(len(steps)) if steps[i] % per_checkpoint == per_checkpoint - 1]
    Checkpoint.objects.bulk_create([
        Checkpoint(run=run, attempt=attempts[attempt_of[i]], rank=0, kind="save",
                   step=int(steps[i]), ts=when(times[i]), duration_s=38.0, bytes=140 << 30,
                   path=f"/ckpt/step-{int(steps[i])}") for i in saves], batch_size=2000)

    first, last = partitions.day_of(plan.start), partitions.day_of(plan.end)
    days = list(range(first, last + 1))
    # The loader attaches its own day tables: the empty ones migrate/beat may have made go first.
    for table in partitions.TABLES:
        with connection.cursor() as cursor:
            for day in days:
                cursor.execute(f'DROP TABLE IF EXISTS "{partitions.partition_name(table, day)}"')
    partitions.forget()

    gpu_columns = [name for name, _ in GPU_FIELDS]
    step_columns = [name for name, _ in STEP_FIELDS]
    started = time.perf_counter()
    all_steps = step_rows(plan, shape, run.pk, attempt_ids)
    step_days = ((all_steps["ts"] + PG_EPOCH_US) // (86400 * 1_000_000)).astype(np.int64)
    loaded = {}

    def gpus():
        loaded["gpus"] = load_days(url, GpuSample._meta.db_table, days,
                                   lambda day: gpu_rows(day * 86400.0, (day + 1) * 86400.0, plan,
                                                        shape, run.pk, attempt_ids),
                                   gpu_columns)

    worker = threading.Thread(target=gpus)  # two COPY streams: one per core
    worker.start()
    loaded["steps"] = load_days(url, StepMetric._meta.db_table, days,
                                lambda day: all_steps[step_days == day], step_columns)
    worker.join()
    if "gpus" not in loaded:
        raise SystemExit("loading the GPU samples failed (see the traceback above)")
    elapsed = time.perf_counter() - started
    log(f"loaded {loaded['gpus']:,} GPU samples and {loaded['steps']:,} step rows in "
        f"{elapsed:.0f} s ({(loaded['gpus'] + loaded['steps']) / elapsed:,.0f} rows/s, binary "
        f"COPY into day tables, indexes built at attach)")
    run.last_step = int(steps.max())
    run.save(update_fields=["last_step"])
    Run.objects.filter(pk=run.pk).update(config={**run.config, "bench": {
        **run.config["bench"], "gpu_samples": loaded["gpus"], "step_rows": loaded["steps"]}})

    started = time.perf_counter()
    with connection.cursor() as cursor:
        # The rebuild groups every sample of the run by GPU and minute; at the default 4 MB that
        # sort spills to disk many times over. A bulk loader's setting, not the collectors'.
        cursor.execute("SET work_mem = '256MB'")
    counts = rollups.rebuild(run.pk)
    log(f"rollups rebuilt in {time.perf_counter() - started:.0f} s: {counts}")
    return run.pk


def loaded_run(shape: Shape):
    """The benchmark run of this shape, if the database already holds it."""
    from collectors.models import Run

    for run in Run.objects.filter(project__slug="bench", config__bench__version=SHAPE_VERSION):
        recorded = run.config["bench"]
        if (all(recorded.get(k) == v for k, v in shape.__dict__.items())
                and recorded.get("gpu_samples")):
            return run
    return None


# --- measuring the pages ----------------------------------------------------------------------

def run_urls(run_id: int) -> list[tuple[str, str]]:
    """(name, path) of the runs list and of every GET URL that takes only a run id."""
    from django.urls import URLPattern, URLResolver, reverse

    from dashboard.views.urls import urlpatterns

    found = []

    def walk(patterns, namespace=""):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, namespace)
                continue
            if not isinstance(pattern, URLPattern) or not pattern.name:
                continue
            converters = set(pattern.pattern.converters)
            if converters == {"run_id"}:
                found.append((pattern.name, reverse(pattern.name, kwargs={"run_id": run_id})))
            elif not converters and pattern.name in ("runs", "runs_json"):
                found.append((pattern.name, reverse(pattern.name)))

    walk(urlpatterns)
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(url: str, port: int) -> subprocess.Popen:
    env = {**os.environ, "DATABASE_URL": url, "DEBUG": "false", "LOG_LEVEL": "WARNING",
           "CELERY_BROKER_URL": "", "CELERY_TASK_ALWAYS_EAGER": "true"}
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "gunicorn"), "dashboard.wsgi:application",
         "--bind", f"127.0.0.1:{port}", "--workers", "2", "--timeout", "120",
         "--log-level", "warning"],
        cwd=ROOT, env=env)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return server
        except OSError:
            if server.poll() is not None:
                raise SystemExit("gunicorn exited before it answered") from None
            time.sleep(0.2)
    server.terminate()
    raise SystemExit("gunicorn did not answer within 30 s")


def max_points(document) -> int:
    """The largest number of points in one Plotly trace anywhere in ``document``."""
    best = 0

    def length(value) -> int:
        if isinstance(value, dict) and "bdata" in value:  # plotly.py's typed-array encoding
            size = np.dtype(value.get("dtype", "f8")).itemsize
            shape = value.get("shape")
            count = len(base64.b64decode(value["bdata"])) // size
            if isinstance(shape, str) and "," in shape:
                return int(shape.split(",")[-1])
            return count
        if isinstance(value, list):
            if value and isinstance(value[0], list):
                return max(len(row) for row in value)
            return len(value)
        return 0

    def walk(node):
        nonlocal best
        if isinstance(node, dict):
            data = node.get("data")
            if isinstance(data, list) and data and all(isinstance(t, dict) for t in data):
                for trace in data:
                    best = max([best] + [length(trace.get(k)) for k in ("x", "y", "z")])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document)
    return best


_SCRIPT_JSON = re.compile(r'<script[^>]*type="application/json"[^>]*>(.*?)</script>', re.S)


def documents(response) -> list:
    if response.headers.get("content-type", "").startswith("application/json"):
        return [response.json()]
    found = []
    for block in _SCRIPT_JSON.findall(response.text):
        try:
            found.append(json.loads(block))
        except ValueError:
            continue
    return found


def measure(base: str, urls: list[tuple[str, str]], cookie: str, requests_per_url: int) -> list:
    import requests

    session = requests.Session()
    session.cookies.set("sessionid", cookie, domain="127.0.0.1")
    results = []
    for name, path in urls:
        timings, status, points, size = [], None, 0, 0
        first_ms = None
        for i in range(requests_per_url + 1):
            started = time.perf_counter()
            response = session.get(base + path, timeout=120, allow_redirects=False)
            elapsed = (time.perf_counter() - started) * 1000
            status = response.status_code
            if status != 200:
                break
            if i == 0:
                first_ms = elapsed
                size = len(response.content)
                points = max([0] + [max_points(doc) for doc in documents(response)])
            else:
                timings.append(elapsed)
            # A URL whose first timed requests all take over twice the limit has failed already;
            # twenty more of them would only stretch the run.
            if len(timings) == 3 and min(timings) > 2 * P95_LIMIT_MS:
                break
        results.append({"name": name, "path": path, "status": status, "first_ms": first_ms,
                         "timings": timings, "points": points, "bytes": size})
        log(f"{path}: p50 {statistics.median(timings):.0f} ms over {len(timings)} requests"
            if timings else f"{path}: HTTP {status}")
    return results


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))]


def report(results: list, shape: Shape, counts: dict, requests: int) -> int:
    print()
    print(f"Dashboard at scale: {counts['gpu_samples']:,} GPU samples, {counts['step_rows']:,} "
          f"step rows ({shape.gpus} GPUs on {shape.hosts} hosts, {shape.days} days)")
    print(f"{'URL':<44} {'first':>7} {'p50':>7} {'p95':>7} {'max':>7} {'points':>7} {'KB':>6}")
    failed = errors = 0
    for r in results:
        if r["status"] != 200 or not r["timings"]:
            print(f"{r['path']:<44} HTTP {r['status']}  <- ERROR")
            errors += 1
            continue
        p50, p95 = statistics.median(r["timings"]), percentile(r["timings"], 0.95)
        bad = p95 >= P95_LIMIT_MS or r["points"] > POINTS_LIMIT
        failed += bad
        cut = f" (stopped after {len(r['timings'])})" if len(r["timings"]) < requests else ""
        print(f"{r['path']:<44} {r['first_ms']:>7.0f} {p50:>7.0f} {p95:>7.0f} "
              f"{max(r['timings']):>7.0f} {r['points']:>7,} {r['bytes'] / 1024:>6.0f}"
              f"{'  <- OVER' + cut if bad else ''}")
    worst = max((percentile(r["timings"], 0.95) for r in results if r["timings"]), default=0)
    most = max((r["points"] for r in results), default=0)
    print(f"worst p95 {worst:.0f} ms (limit {P95_LIMIT_MS:.0f}, ratio {worst / P95_LIMIT_MS:.2f}); "
          f"largest trace {most:,} points (limit {POINTS_LIMIT:,}); times in ms, "
          f"{requests} requests each after one warm-up")
    if errors:
        return 2
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a ~2M-sample run instead of 20M")
    parser.add_argument("--reuse", action="store_true",
                        help="keep an already-loaded database whose run has this shape")
    parser.add_argument("--db", default="runwatch_bench_dash", help="the benchmark's database")
    parser.add_argument("--requests", type=int, default=20, help="timed requests per URL")
    parser.add_argument("--drop", action="store_true", help="drop the database when done")
    args = parser.parse_args(argv)
    # A SIGTERM (timeout, Ctrl-C from make) must still stop the gunicorn this script started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    shape = QUICK if args.quick else Shape()
    url, fresh = open_database(args.db, keep=args.reuse)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    run = None if fresh else loaded_run(shape)
    if run is None:
        if not fresh:
            from django.db import connections

            connections.close_all()
            create_database(url, drop=True)
            call_command("migrate", verbosity=0)
        log(f"loading a run of {shape.gpus} GPUs x {shape.days} days into {args.db}")
        run_id = load(url, shape)
        vacuum_analyze(url)
    else:
        run_id = run.pk
        log(f"reusing run {run_id} in {args.db}")
    from collectors.models import Run

    run = Run.objects.get(pk=run_id)
    counts = run.config["bench"]
    urls = run_urls(run_id)
    cookie = member_client(run.project).cookies["sessionid"].value
    from django.db import connections

    connections.close_all()
    port = free_port()
    server = serve(url, port)
    try:
        log(f"measuring {len(urls)} URLs on 127.0.0.1:{port}: " + ", ".join(n for n, _ in urls))
        results = measure(f"http://127.0.0.1:{port}", urls, cookie, args.requests)
    finally:
        server.terminate()
        server.wait(timeout=30)
    status = report(results, shape, counts, args.requests)
    if args.drop:
        drop_database(url)
    return status


if __name__ == "__main__":
    sys.exit(main())
