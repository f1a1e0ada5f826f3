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

import sys

import _pages as pages


def main() -> int:
    args = pages.parse_cluster_arguments(
        pages.cluster_arguments(__doc__, "runwatch_bench_cluster_time"))
    url, _ = pages.open_database(args.db, keep=args.reuse)
    from collectors.analysis.stragglers import read_stragglers
    from collectors.analysis.time_of_day import read_time_of_day
    from collectors.models import GpuMinute, StepMinute

    run = pages.simulated_run(
        args, f"bench-{args.gpus}x{args.days:g}d-s{args.seed}",
        lambda truth: {"diurnal_amplitude_pct": truth.diurnal_amplitude_pct,
                       "stragglers": truth.stragglers})
    pages.vacuum_analyze(url, "collectors_stepminute", "collectors_gpuminute",
                         "collectors_hostminute", "collectors_ingestedbatch")
    step_minutes = StepMinute.objects.filter(run=run).count()
    gpu_minutes = GpuMinute.objects.filter(run=run).count()
    print(f"run {run.name}: {run.world_size} GPUs, {step_minutes:,} rank-minutes, "
          f"{gpu_minutes:,} GPU-minutes (rollup rows read by the pages)")

    client = pages.member_client(run.project)
    results = {name: pages.timed(pages.page(client, name, run), args.requests)
               for name in ("run", "run_time_of_day", "run_time_of_day_json", "run_stragglers",
                            "run_stragglers_json")}
    results["read_time_of_day()"] = pages.timed(lambda: read_time_of_day(run), args.requests)
    results["read_stragglers()"] = pages.timed(lambda: read_stragglers(run), args.requests)
    failed = pages.print_timings(results)

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
