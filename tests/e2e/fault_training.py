"""The training job the fault tests run under torchrun: a small data-parallel model (gloo) that
trains until the test says stop, streaming to Runwatch with simulated GPU telemetry.

    torchrun --standalone --nproc_per_node=2 tests/e2e/fault_training.py \
        --project faults --run-name redis --stop-file /tmp/stop --record-dir /tmp/records

Steps are paced (``--step-s``) so that two ranks and the collectors share a small machine
without starving each other, and the run lasts as long as the fault needs: the test creates
``--stop-file`` once the fault is over, and the ranks agree (all-reduce) on the step to stop at.

Each rank writes ``rank<N>.json`` into ``--record-dir`` at the end: what it handed the plugin
(steps, checkpoint saves, GPU samples) and the plugin's own counters. The test compares these
with what the database holds."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from tests.e2e.counting_monitor import CountingMonitor  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--project", required=True)
    parser.add_argument("--run-name", required=True)
    parser.add_argument("--stop-file", type=Path, required=True)
    parser.add_argument("--record-dir", type=Path, required=True)
    parser.add_argument("--step-s", type=float, default=0.1, help="target seconds per step")
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--max-s", type=float, default=600, help="stop after this long anyway")
    parser.add_argument("--close-timeout-s", type=float, default=120)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(1)
    dist.init_process_group(backend="gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(rank)
    target_w = torch.linspace(-1, 1, 32)
    checkpoint = args.record_dir / f"checkpoint-rank{rank}.pt"
    steps = checkpoints = 0
    started = time.monotonic()
    mon = CountingMonitor(project=args.project, run=args.run_name, config={"world": world_size},
                          # Heartbeats every second: many small events, each of which must
                          # arrive exactly once like the rest.
                          heartbeat_interval_s=1.0)
    with mon:
        while True:
            begun = time.monotonic()
            flag = torch.tensor([1 if args.stop_file.exists()
                                 or begun - started > args.max_s else 0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item():
                break
            inputs = torch.randn(64, 32, generator=data)
            loss = nn.functional.mse_loss(model(inputs).squeeze(-1), inputs @ target_w)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            mon.step(steps, loss=loss.detach(), lr=0.05, tokens=64)
            steps += 1
            if rank == 0 and steps % args.checkpoint_every == 0:
                with mon.checkpoint_save(steps - 1, checkpoint):
                    torch.save(model.module.state_dict(), checkpoint)
                checkpoints += 1
            time.sleep(max(0.0, args.step_s - (time.monotonic() - begun)))
        # Long enough to replay what an outage left in the spool.
        delivered = mon.close(timeout_s=args.close_timeout_s)
    stats = mon.stats
    record = {
        "rank": rank, "host": mon.environment.host if mon.environment else None,
        "steps": steps, "checkpoints": checkpoints, "gpu_rows": mon.gpu_rows_accepted,
        # start + finish + heartbeats + checkpoint saves: every event this rank queued.
        "events": 2 + stats["heartbeats"] + checkpoints,
        "delivered": delivered, "stats": stats, "seconds": time.monotonic() - started,
    }
    args.record_dir.mkdir(parents=True, exist_ok=True)
    (args.record_dir / f"rank{rank}.json").write_text(json.dumps(record))
    print(f"rank {rank}: {json.dumps(record)}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
