"""The Time of day and Stragglers pages of a simulated 512-GPU, 3-day run: how long each page and
JSON endpoint takes to answer, and whether the analyses recover the simulator's planted truth.
One command:

    .venv/bin/python bench/cluster_time_pages.py            # simulate (or reuse) 512 GPUs x 3 days
    .venv/bin/python bench/cluster_time_pages.py --quick    # 64 GPUs x 1 day, for development
    .venv/bin/python bench/cluster_time_pages.py --reuse    # measure again without simulating

1. creates a dedicated database (``--db``, default runwatch_bench_cluster_time, on the server of
   DATABASE_URL or 127.0.0.1:5432) and migrates it; with ``--reuse`` a database already holding
   the run is kept;
2. runs ``collectors.simulation.run_simulation`` (the real ingest path; the rollups are kept by
   ingest) with the requested shape, keeping its ground truth beside the run (Run.config);
3. VACUUM ANALYZE, then with Django's test client (in-process: the view, its queries and the
   template, no HTTP) requests the run's Overview page as the reference, then the two pages and
   their JSON ``--requests`` times each after one warm-up, printing p50/max and the ratio to the
   1 s target and to the Overview page measured in the same run; also the analysis reads alone;
4. prints the recovered diurnal amplitude against the planted one and the stragglers found
   against the planted ones.

Exits 1 if a page's p50 reaches 1 s or the truth is missed (amplitude off by more than 0.2 pp, or
the stragglers differ). Timings on a shared 2-core machine are noisy: rerun on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 1000.0


def database_url(name: str) -> str:
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    parts = urlsplit(base)
    if not parts.scheme.startswith("postgres"):
        parts = urlsplit("postgres://postgres@127.0.0.1:5432/postgres")
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, ""))


def create_database(url: str, *, drop: bool) -> bool:
    """Creates the bench database; False when it already existed and was kept."""
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    admin = urlunsplit(urlsplit(url)._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if exists and not drop:
            return False
        if exists:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return True


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    os.environ.setdefault("CELERY_TASK_ALWAYS_EAGER", "true")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def simulated_run(args):
    from django.core.management import call_command

    from collectors.models import Run
    from collectors.simulation import SimConfig, run_simulation

    call_command("migrate", verbosity=0)
    name = f"bench-{args.gpus}x{args.days:g}d-s{args.seed}"
    run = Run.objects.filter(project__slug="sim", name=name).first()
    if run is not None and "bench_truth" in run.config:
        log(f"reusing run {name} (id {run.pk})")
        return run
    if run is not None:
        run.delete()
    log(f"simulating {args.gpus} GPUs x {args.days:g} days (seed {args.seed}) through ingest ...")
    started = time.perf_counter()
    last = [0.0]

    def progress(fraction: float) -> None:
        if fraction - last[0] >= 0.05 or fraction >= 1.0:
            last[0] = fraction
            log(f"  {100 * fraction:5.1f}%  {time.perf_counter() - started:7.1f} s")

    # GPU samples every 60 s above 64 GPU-days, as `manage.py simulate` does by default.
    interval = 60.0 if args.gpus * args.days > 64 else 10.0
    truth = run_simulation(SimConfig(project="sim", run_name=name, gpus=args.gpus, days=args.days,
                                     seed=args.seed, sample_interval_s=interval),
                           progress=progress)
    log(f"simulated in {time.perf_counter() - started:.0f} s")
    run = Run.objects.get(pk=truth.run_id)
    run.config = {**run.config, "bench_truth": {
        "diurnal_amplitude_pct": truth.diurnal_amplitude_pct,
        "stragglers": truth.stragglers}}
    run.save(update_fields=["config"])
    return run


def timed(fn, repeats: int) -> list[float]:
    fn()  # warm-up: connection, template and plan caches
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - started))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=512)
    parser.add_argument("--days", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="64 GPUs, 1 day, 3 requests")
    parser.add_argument("--reuse", action="store_true", help="keep an existing bench database")
    parser.add_argument("--db", default="runwatch_bench_cluster_time")
    args = parser.parse_args()
    if args.quick:
        args.gpus, args.days, args.requests = 64, 1.0, 3

    url = database_url(args.db)
    create_database(url, drop=not args.reuse)
    setup_django(url)
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.urls import reverse

    from collectors.analysis.stragglers import read_stragglers
    from collectors.analysis.time_of_day import read_time_of_day
    from collectors.models import GpuMinute, StepMinute

    run = simulated_run(args)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE collectors_stepminute")
        cursor.execute("VACUUM ANALYZE collectors_gpuminute")
        cursor.execute("VACUUM ANALYZE collectors_hostminute")
        cursor.execute("VACUUM ANALYZE collectors_ingestedbatch")
    step_minutes = StepMinute.objects.filter(run=run).count()
    gpu_minutes = GpuMinute.objects.filter(run=run).count()
    print(f"run {run.name}: {run.world_size} GPUs, {step_minutes:,} rank-minutes, "
          f"{gpu_minutes:,} GPU-minutes (rollup rows read by the pages)")

    user, _ = User.objects.get_or_create(username="bench")
    run.project.members.add(user)
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)

    def get(name: str):
        def fetch():
            response = client.get(reverse(name, args=[run.pk]))
            assert response.status_code == 200, (name, response.status_code)
        return fetch

    results = {}
    for name in ("run", "run_time_of_day", "run_time_of_day_json", "run_stragglers",
                 "run_stragglers_json"):
        results[name] = timed(get(name), args.requests)
    results["read_time_of_day()"] = timed(lambda: read_time_of_day(run), args.requests)
    results["read_stragglers()"] = timed(lambda: read_stragglers(run), args.requests)

    reference = statistics.median(results["run"])
    print(f"\n{'request':<24} {'p50 ms':>8} {'max ms':>8} {'p50/1 s':>8} {'p50/Overview':>13}")
    failed = False
    for name, times in results.items():
        p50 = statistics.median(times)
        print(f"{name:<24} {p50:8.0f} {max(times):8.0f} {p50 / TARGET_MS:8.2f} "
              f"{p50 / reference:13.2f}")
        failed |= name.startswith("run_") and p50 >= TARGET_MS

    truth = run.config["bench_truth"]
    result = read_time_of_day(run)
    report = read_stragglers(run, top_n=max(1, len(truth["stragglers"])))
    planted = sorted(s["rank"] for s in truth["stragglers"])
    found = sorted(report.flagged_ranks)
    off = abs((result.amplitude_pp or 0.0) - truth["diurnal_amplitude_pct"])
    print(f"\ndiurnal amplitude: {result.amplitude_pp:.3f} pp measured, "
          f"{truth['diurnal_amplitude_pct']:.3f} pp planted (off by {off:.3f} pp; tolerance 0.2)")
    print(f"correlation with GPU temperature: r = {result.correlation.r:+.3f} "
          f"(n = {result.correlation.n})")
    print(f"stragglers: found {found}, planted {planted}; "
          f"cost {report.cost.straggler_wait_s or 0:.3f} s per step")
    failed |= off > 0.2 or found != planted
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
