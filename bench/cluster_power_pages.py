"""The Power and GPU health pages of a simulated 512-GPU, 3-day run: how long each page and JSON
endpoint takes to answer, and whether the analyses recover the simulator's planted truth.
One command:

    .venv/bin/python bench/cluster_power_pages.py            # simulate (or reuse) 512 GPUs x 3 days
    .venv/bin/python bench/cluster_power_pages.py --quick    # 64 GPUs x 1 day, for development
    .venv/bin/python bench/cluster_power_pages.py --reuse    # measure again without simulating

1. creates a dedicated database (``--db``, default runwatch_bench_cluster_power, on the server of
   DATABASE_URL or 127.0.0.1:5432) and migrates it; with ``--reuse`` a database already holding
   the run is kept;
2. runs ``collectors.simulation.run_simulation`` (the real ingest path; rollups kept by ingest)
   with the requested shape, keeping its planted swings and hot GPUs beside the run (Run.config);
3. VACUUM ANALYZE, then with Django's test client (in-process: the view, its queries and the
   template, no HTTP) requests the run's Overview page as the reference, then the Power and GPU
   health pages and their JSON ``--requests`` times each after one warm-up, and a zoomed Power
   range (one hour, per second from raw samples); prints p50/max and the ratio to the 1 s target
   and to the Overview page measured in the same run;
4. prints the largest planted swing beside the one found (cause, size, time) and the planted hot
   GPUs beside the top of the hottest list.

Exits 1 if a page's p50 reaches 1 s or the truth is missed (largest swing not found with its cause
and size within 5%, or hot GPUs not on top). Timings on a shared 2-core machine are noisy: rerun
on a quiet machine.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime

import _pages as pages


def main() -> int:
    parser = pages.cluster_arguments(__doc__, "runwatch_bench_cluster_power")
    parser.add_argument("--interruptions", type=int, default=2)
    args = pages.parse_cluster_arguments(parser)
    url, _ = pages.open_database(args.db, keep=args.reuse)
    from collectors.models import GpuMinute, GpuSample
    from dashboard.views import cluster_presenters

    run = pages.simulated_run(
        args, f"bench-power-{args.gpus}x{args.days:g}d-s{args.seed}",
        lambda truth: {"swings": truth.swings[:20], "hot_gpus": truth.hot_gpus},
        interruptions=args.interruptions)
    pages.vacuum_analyze(url, "collectors_gpuminute", "collectors_hostminute",
                         "collectors_gpuhour", "collectors_gpusample", "collectors_stepmetric")
    samples = GpuSample.objects.filter(run=run).count()
    gpu_minutes = GpuMinute.objects.filter(run=run).count()
    print(f"run {run.name}: {run.world_size} GPUs, {samples:,} raw GPU samples, "
          f"{gpu_minutes:,} GPU-minutes (rollup rows read by the pages)")

    client = pages.member_client(run.project)
    first = run.attempts.order_by("number").first().started_at.timestamp()
    zoom = {"start": f"{first + 6 * 3600:.0f}", "end": f"{first + 7 * 3600:.0f}"}
    results = {name: pages.timed(pages.page(client, name, run), args.requests)
               for name in ("run", "run_power", "run_power_json", "run_gpu_health",
                            "run_gpu_health_json")}
    results["run_power_json (1 h)"] = pages.timed(
        pages.page(client, "run_power_json", run, zoom), args.requests)
    results["power_view()"] = pages.timed(lambda: cluster_presenters.power_view(run),
                                          args.requests)
    results["gpu_health_view()"] = pages.timed(lambda: cluster_presenters.gpu_health_view(run),
                                               args.requests)
    failed = pages.print_timings(results)

    truth = run.config["bench_truth"]
    view = cluster_presenters.power_view(run)
    largest = truth["swings"][0]
    at = datetime.fromisoformat(largest["start"]).timestamp()
    found = [s for s in view.swings if abs(s.start - at) <= 120
             and (s.delta_kw > 0) == (largest["delta_kw"] > 0)]
    print(f"\nlargest planted swing: {largest['delta_kw']:+.1f} kW ({largest['cause']}) at "
          f"{largest['start']}")
    if found:
        s = found[0]
        print(f"found:                 {s.delta_kw:+.1f} kW ({s.cause}) at "
              f"{datetime.fromtimestamp(s.start, UTC).isoformat()}, "
              f"{s.rate_kw_s:+.1f} kW/s over {s.duration_s:.0f} s "
              f"({'per-minute rollup + per-second refinement' if view.per_minute else 'per second'})")
        failed |= s.cause != largest["cause"] or \
            abs(s.delta_kw - largest["delta_kw"]) > 0.05 * abs(largest["delta_kw"])
    else:
        print("found:                 nothing within 120 s")
        failed = True
    health = cluster_presenters.gpu_health_view(run)
    hot = sorted(f"{h['host']}:{h['gpu']}" for h in truth["hot_gpus"])
    top = sorted(g.name for g in health.hottest[:len(hot)])
    print(f"hot GPUs: planted {hot}, top of the hottest list {top}")
    failed |= hot != top
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
