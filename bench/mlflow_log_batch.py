"""The MLflow peer of bench/ingest_e2e.py: logs the same telemetry to an MLflow tracking server
through ``MlflowClient.log_batch``, as fast as the server takes it, and prints one JSON line.

Runs in .venv-bench (MLflow is not a dependency of Runwatch); ingest_e2e.py starts it.

    .venv-bench/bin/python bench/mlflow_log_batch.py --url http://127.0.0.1:PORT --threads 4 \
        --duration 60 --gpus-per-host 8 --seconds-per-batch 60 --step-s 1

Each Runwatch batch (one host's GPU samples over ``seconds-per-batch`` at 1 Hz plus that rank's
steps) becomes MLflow metrics: six per GPU sample (temp, power, util, memory, SM clock, throttle,
keyed ``<host>/gpu<N>/<field>``) and five per step row (loss, lr, grad norm, step time, tokens),
each with its step and timestamp, sent in calls of at most 1,000 metrics (MLflow's limit per
log_batch). Every thread owns one MLflow run and its own hosts, as one process per host would.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")

GPU_FIELDS = ("temp_c", "power_w", "util_pct", "mem_used_mb", "sm_clock_mhz", "throttle")
STEP_FIELDS = ("loss", "lr", "grad_norm", "duration_s", "tokens")
MAX_METRICS_PER_CALL = 1000


def batch_metrics(Metric, host: str, window: int, gpus: int, seconds: int, step_s: float,
                  t0: float) -> tuple[list, int, int]:
    """The metrics of one host's batch, and how many GPU samples and step rows they hold."""
    metrics = []
    start = t0 + window * seconds
    for second in range(seconds):
        ts_ms = int((start + second) * 1000)
        step = window * seconds + second
        for gpu in range(gpus):
            values = (65.0 + (gpu + second) % 10, 600.0 + 10 * (gpu % 5), 97.0, 71_000.0,
                      1980.0, 0.0)
            for field, value in zip(GPU_FIELDS, values, strict=True):
                metrics.append(Metric(f"{host}/gpu{gpu}/{field}", value, ts_ms, step))
    steps = max(1, int(seconds / step_s))
    for j in range(steps):
        step = window * steps + j
        ts_ms = int((start + j * step_s) * 1000)
        values = (2.0 + 1 / (step + 1), 3e-4, 1.0, step_s, 4096.0)
        for field, value in zip(STEP_FIELDS, values, strict=True):
            metrics.append(Metric(f"{host}/{field}", value, ts_ms, step))
    return metrics, gpus * seconds, steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--gpus-per-host", type=int, default=8)
    parser.add_argument("--seconds-per-batch", type=int, default=60)
    parser.add_argument("--step-s", type=float, default=1.0)
    args = parser.parse_args()

    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=args.url)
    experiment = client.create_experiment(f"runwatch-bench-{int(time.time())}")
    t0 = time.time() - 86_400
    lock = threading.Lock()
    totals = {"gpu_samples": 0, "steps": 0, "metrics": 0, "calls": 0, "errors": 0}
    call_seconds: list[float] = []
    stop_at = time.monotonic() + args.duration
    first_error: list[str] = []

    def worker(index: int) -> None:
        run_id = client.create_run(experiment, run_name=f"host-group-{index}").info.run_id
        window = 0
        while time.monotonic() < stop_at:
            host = f"node{index:05d}"
            metrics, gpu_samples, steps = batch_metrics(
                Metric, host, window, args.gpus_per_host, args.seconds_per_batch, args.step_s, t0)
            window += 1
            sent = 0
            for start in range(0, len(metrics), MAX_METRICS_PER_CALL):
                if time.monotonic() >= stop_at:
                    break
                chunk = metrics[start:start + MAX_METRICS_PER_CALL]
                began = time.perf_counter()
                try:
                    client.log_batch(run_id, metrics=chunk)
                except Exception as error:  # counted and reported; the run goes on
                    with lock:
                        totals["errors"] += 1
                        if not first_error:
                            first_error.append(repr(error)[:500])
                    continue
                elapsed = time.perf_counter() - began
                sent += len(chunk)
                with lock:
                    totals["metrics"] += len(chunk)
                    totals["calls"] += 1
                    call_seconds.append(elapsed)
            # Samples and steps count in proportion to the metrics of the batch that got through.
            share = sent / len(metrics)
            with lock:
                totals["gpu_samples"] += gpu_samples * share
                totals["steps"] += steps * share

    began = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=args.duration + 120)
    elapsed = time.monotonic() - began
    call_seconds.sort()

    def pct(q: float) -> float:
        if not call_seconds:
            return math.nan
        return call_seconds[min(len(call_seconds) - 1, int(q * len(call_seconds)))]

    import mlflow

    print(json.dumps({
        "mlflow_version": mlflow.__version__,
        "elapsed_s": elapsed,
        "threads": args.threads,
        "gpu_samples": totals["gpu_samples"],
        "steps": totals["steps"],
        "metrics": totals["metrics"],
        "calls": totals["calls"],
        "errors": totals["errors"],
        "first_error": first_error[0] if first_error else None,
        "gpu_samples_per_s": totals["gpu_samples"] / elapsed,
        "steps_per_s": totals["steps"] / elapsed,
        "metrics_per_s": totals["metrics"] / elapsed,
        "call_p50_s": pct(0.5),
        "call_p95_s": pct(0.95),
    }))
    return 0 if totals["calls"] else 1


if __name__ == "__main__":
    sys.exit(main())
