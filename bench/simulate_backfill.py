"""How long a simulated cluster's backfill takes (manage.py simulate's work, in this process), and
how much of it is the simulator's own generation of batches rather than the collectors' ingest.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/runwatch_bench_sim python bench/simulate_backfill.py
    DATABASE_URL=... python bench/simulate_backfill.py --quick     # 64 GPUs for 6 hours, ~1 min

Default: the issue's target, 512 GPUs for 3 days with the command's defaults (GPUs sampled every
60 s above 64 GPU-days, local rank 0 of each host plus the slow ranks report steps, an hour of one
rank per batch). It first times generating every batch without storing it (the peer: what the
simulator alone costs), then the whole backfill through collectors.tasks.ingest_batch, and prints
both, rows per second and the ratio. It migrates the database it is given and leaves its rows
there: point it at a scratch database.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=512)
    parser.add_argument("--days", type=float, default=3.0)
    parser.add_argument("--quick", action="store_true", help="64 GPUs for 6 hours")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.quick:
        args.gpus, args.days = 64, 0.25

    import django

    django.setup()
    from django.core.management import call_command

    from collectors.management.commands.simulate import FINE_SAMPLING_GPU_DAYS
    from collectors.simulation import SimConfig, run_simulation
    from collectors.simulation.batches import BatchMaker
    from collectors.simulation.plan import build_plan
    from collectors.simulation.run import _windows

    call_command("migrate", verbosity=0)
    interval = 10.0 if args.gpus * args.days <= FINE_SAMPLING_GPU_DAYS else 60.0
    config = SimConfig(run_name=f"bench-{args.gpus}gpu-{args.days:g}d-{int(time.time())}",
                       project="bench", gpus=args.gpus, days=args.days, seed=args.seed,
                       start=datetime(2026, 11, 20, tzinfo=UTC), sample_interval_s=interval)

    began = time.perf_counter()
    plan = build_plan(config, config.resolved_start().timestamp())
    maker = BatchMaker(plan)
    rows = 0
    windows = _windows(plan.start, plan.end, config.flush_interval_s, None)
    for index, (w0, w1) in enumerate(windows):
        for batch in maker.window(w0, w1, index):
            rows += len(batch["steps"]["step"]) + len(batch["gpus"]["ts"]) + len(batch["events"])
    generate_s = time.perf_counter() - began

    began = time.perf_counter()
    truth = run_simulation(config)
    total_s = time.perf_counter() - began
    sent = truth.details["rows_sent"]
    print(f"simulated backfill, {config.world_size} GPUs x {args.days:g} days "
          f"(sample every {interval:g} s, {len(plan.step_ranks)} step-reporting ranks)")
    print(f"  rows: {sent['steps']:,} step rows, {sent['gpu_samples']:,} GPU samples, "
          f"{sent['events']:,} events in {sent['batches']:,} batches")
    print(f"  generating the batches alone: {generate_s:.1f} s ({rows / generate_s:,.0f} rows/s)")
    print(f"  whole backfill through ingest_batch: {total_s:.1f} s "
          f"({rows / total_s:,.0f} rows/s)")
    print(f"  generation / whole: {generate_s / total_s:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
