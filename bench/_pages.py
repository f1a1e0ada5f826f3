"""What the dashboard page benchmarks share (dashboard_load.py, cluster_time_pages.py and
cluster_power_pages.py): a database of their own, Django set up in-process against it, a signed-in
project member, and, for the cluster pages, a simulated run and in-process request timings.

Imported by scripts run as ``python bench/<script>.py``, whose folder Python puts first on
sys.path. Django is imported inside the functions: it may only load after ``setup_django``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 1000.0  # the cluster pages' target: a page answers within a second


def log(message: str) -> None:
    # Progress goes to stderr so that stdout holds the report alone.
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the benchmark's own database -------------------------------------------------------------

def database_url(name: str) -> str:
    """Database ``name`` on DATABASE_URL's server (127.0.0.1:5432 when that is not PostgreSQL)."""
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    parts = urlsplit(base)
    if not parts.scheme.startswith("postgres"):
        parts = urlsplit("postgres://postgres@127.0.0.1:5432/postgres")
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, ""))


def admin_connect(url: str):
    import psycopg

    return psycopg.connect(urlunsplit(urlsplit(url)._replace(path="/postgres")), autocommit=True)


def create_database(url: str, *, drop: bool) -> bool:
    """Creates the bench database; returns False when it already existed (and was kept)."""
    name = urlsplit(url).path.lstrip("/")
    with admin_connect(url) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if exists and not drop:
            return False
        if exists:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return True


def drop_database(url: str) -> None:
    with admin_connect(url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{urlsplit(url).path.lstrip("/")}" WITH (FORCE)')


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    os.environ.setdefault("CELERY_TASK_ALWAYS_EAGER", "true")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def open_database(name: str, *, keep: bool) -> tuple[str, bool]:
    """The URL of bench database ``name``, created (or kept, with ``keep``) and set up for Django;
    and whether it was created afresh."""
    url = database_url(name)
    fresh = create_database(url, drop=not keep)
    setup_django(url)
    return url, fresh


def vacuum_analyze(url: str, *tables: str) -> None:
    """VACUUM ANALYZE of ``tables`` (the whole database without any), so plans see loaded rows."""
    import psycopg

    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE " + ", ".join(tables))
    log(f"VACUUM ANALYZE in {time.perf_counter() - started:.0f} s")


def member_client(project):
    """Django's test client signed in as "bench", a member of ``project``."""
    from django.contrib.auth.models import User
    from django.test import Client

    user, _ = User.objects.get_or_create(username="bench")
    project.members.add(user)
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    return client


# --- the cluster pages: a simulated run, requests timed in-process ----------------------------

def cluster_arguments(doc: str, db: str) -> argparse.ArgumentParser:
    """The options both cluster page benchmarks take; parse with ``parse_cluster_arguments``."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=512)
    parser.add_argument("--days", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="64 GPUs, 1 day, 3 requests")
    parser.add_argument("--reuse", action="store_true", help="keep an existing bench database")
    parser.add_argument("--db", default=db)
    return parser


def parse_cluster_arguments(parser: argparse.ArgumentParser) -> argparse.Namespace:
    args = parser.parse_args()
    if args.quick:
        args.gpus, args.days, args.requests = 64, 1.0, 3
    return args


def simulated_run(args: argparse.Namespace, name: str, truth_of: Callable[..., dict], **options):
    """Run ``name`` of project "sim" with ``args``' shape: simulated through the real ingest path
    (SimConfig ``options`` added) unless the database holds it with its truth already; the truth
    kept is ``truth_of(the simulation's GroundTruth)``, in Run.config["bench_truth"]."""
    from django.core.management import call_command

    from collectors.models import Run
    from collectors.simulation import SimConfig, run_simulation

    call_command("migrate", verbosity=0)
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
                                     seed=args.seed, sample_interval_s=interval, **options),
                           progress=progress)
    log(f"simulated in {time.perf_counter() - started:.0f} s")
    run = Run.objects.get(pk=truth.run_id)
    run.config = {**run.config, "bench_truth": truth_of(truth)}
    run.save(update_fields=["config"])
    return run


def page(client, name: str, run, query: dict | None = None) -> Callable[[], None]:
    """A request for URL ``name`` of ``run`` that fails unless it answers 200."""
    from django.urls import reverse

    path = reverse(name, args=[run.pk])

    def fetch() -> None:
        response = client.get(path, query or {})
        assert response.status_code == 200, (name, response.status_code)

    return fetch


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    """Milliseconds of ``repeats`` calls of ``fn`` after one untimed warm-up call."""
    fn()  # warm-up: connection, template and plan caches
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - started))
    return times


def print_timings(results: dict[str, list[float]]) -> bool:
    """The p50/max table, against the 1 s target and the Overview page (``results["run"]``);
    True when a page (a name starting "run_") has its p50 at or past the target."""
    reference = statistics.median(results["run"])
    print(f"\n{'request':<24} {'p50 ms':>8} {'max ms':>8} {'p50/1 s':>8} {'p50/Overview':>13}")
    failed = False
    for name, times in results.items():
        p50 = statistics.median(times)
        print(f"{name:<24} {p50:8.0f} {max(times):8.0f} {p50 / TARGET_MS:8.2f} "
              f"{p50 / reference:13.2f}")
        failed |= name.startswith("run_") and p50 >= TARGET_MS
    return failed
