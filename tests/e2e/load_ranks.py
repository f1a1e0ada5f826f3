"""Simulated training ranks for the load test: one process holding ``--ranks`` ranks, each a
thread with its own real ``trainer_plugin.Monitor`` sending over the real HTTP transport.

    python tests/e2e/load_ranks.py --url http://127.0.0.1:8123 --token T --project load \
        --run-name load --first-rank 0 --ranks 50 --world-size 200 --seconds 120 --out /tmp/r

Ranks are numbered like a job of ``--world-size`` ranks on 8-GPU hosts: rank r runs on host
``node<r // 8>`` as local rank ``r % 8``, and local rank 0 of each host samples its 8 (simulated)
GPUs once a second, as the real plugin does. Each rank steps every ``--step-s`` seconds.

Writes ``rank<N>.json`` per rank (what it handed the plugin and the plugin's counters, the same
record as tests/e2e/fault_training.py) and ``sends-<first-rank>.json``: per batch id, when it was
first handed to the transport and when the collector accepted it (wall-clock seconds)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.e2e.counting_monitor import CountingMonitor  # noqa: E402
from trainer_plugin.transports import http as http_transport  # noqa: E402

GPUS_PER_HOST = 8

_sends: dict[str, list[float | None]] = {}
_send_lock = threading.Lock()
_plain_send = http_transport.HttpTransport.send


def timed_send(self, batch, timeout_s=None):
    """The real send, timed: the first attempt's start and the accepting answer's arrival."""
    started = time.time()
    with _send_lock:
        _sends.setdefault(batch["batch_id"], [started, None])
    _plain_send(self, batch, timeout_s)
    with _send_lock:
        _sends[batch["batch_id"]][1] = time.time()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    for name in ("--url", "--token", "--project", "--run-name"):
        parser.add_argument(name, required=True)
    parser.add_argument("--first-rank", type=int, required=True)
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--step-s", type=float, default=0.5)
    parser.add_argument("--flush-s", type=float, default=1.0)
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args()


def monitor_for(rank: int, args: argparse.Namespace) -> CountingMonitor:
    # The Monitor reads rank and world size from torchrun's variables when it is built; building
    # one rank at a time on this thread gives each its own.
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(args.world_size),
                      LOCAL_RANK=str(rank % GPUS_PER_HOST))
    return CountingMonitor(project=args.project, run=args.run_name, url=args.url,
                           token=args.token, host=f"node{rank // GPUS_PER_HOST:03d}",
                           flush_interval_s=args.flush_s, capture_signals=False,
                           spool_dir=args.out / "spool",
                           gpu_sampling="simulated" if rank % GPUS_PER_HOST == 0 else False)


def train(rank: int, mon: CountingMonitor, args: argparse.Namespace, start: float,
          results: dict[int, dict]) -> None:
    steps = 0
    # Ranks start spread over one step period, as real ranks drift apart.
    next_at = start + args.step_s * (rank % 97) / 97
    deadline = start + args.seconds
    while True:
        time.sleep(max(0.0, next_at - time.time()))
        if time.time() >= deadline:
            break
        mon.step(steps, loss=2.0 / (1 + steps), lr=1e-4, tokens=4096)
        steps += 1
        next_at += args.step_s
    delivered = mon.close(timeout_s=60)
    stats = mon.stats
    results[rank] = {"rank": rank, "steps": steps, "checkpoints": 0,
                     "gpu_rows": mon.gpu_rows_accepted, "events": 2 + stats["heartbeats"],
                     "delivered": delivered, "stats": stats}


def main() -> int:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    http_transport.HttpTransport.send = timed_send
    ranks = range(args.first_rank, args.first_rank + args.ranks)
    monitors = {rank: monitor_for(rank, args) for rank in ranks}
    results: dict[int, dict] = {}
    start = time.time()
    threads = [threading.Thread(target=train, args=(rank, mon, args, start, results),
                                name=f"rank{rank}") for rank, mon in monitors.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for rank, result in results.items():
        (args.out / f"rank{rank}.json").write_text(json.dumps(result))
    with _send_lock:
        (args.out / f"sends-{args.first_rank}.json").write_text(json.dumps(_sends))
    print(f"ranks {args.first_rank}..{args.first_rank + args.ranks - 1}: "
          f"{sum(r['steps'] for r in results.values())} steps, "
          f"{sum(r['delivered'] for r in results.values())}/{len(results)} delivered everything",
          flush=True)
    return 0 if len(results) == args.ranks else 1


if __name__ == "__main__":
    sys.exit(main())
