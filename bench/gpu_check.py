"""GPU telemetry check for a real GPU host: runs Runwatch's GPU sampler against real NVML while a
small CUDA training load runs, prints what it read per GPU and writes it all as JSON.

    python bench/gpu_check.py                 # 60 s: 10 s idle, 45 s of load, 5 s cool-down
    python bench/gpu_check.py --seconds 30 --no-load

The JSON goes to $OUT/gpu_check.json when $OUT is set, else ./gpu_check.json (or --out). On a
machine without an NVIDIA GPU, driver or nvidia-ml-py it says so and exits with status 0, writing
{"status": "no_gpu", ...}.

What to look for: every GPU present; no column null that the GPU supports; power near idle at first
and near the board limit under load; clocks and throttle reasons that make sense (GpuIdle while
idle, SwPowerCap under heavy load); ticks about --interval apart; and whether XID events are
watched on this driver.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer_plugin.gpu import GpuSampler  # noqa: E402
from trainer_plugin.protocol import GPU_COLUMNS  # noqa: E402

IDLE_S = 10.0
COOL_DOWN_S = 5.0

# nvmlClocksEventReason* bits (NVML's values), for machines whose nvidia-ml-py is older.
THROTTLE_BITS = {
    0x1: "GpuIdle",
    0x2: "ApplicationsClocksSetting",
    0x4: "SwPowerCap",
    0x8: "HwSlowdown",
    0x10: "SyncBoost",
    0x20: "SwThermalSlowdown",
    0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown",
    0x100: "DisplayClockSetting",
    0x200: "BoardLimit",
    0x400: "Reliability",
}


class Recorder:
    """The sampler's sink: keeps everything it is handed."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self.events: list[dict[str, Any]] = []
        self.simulated: bool | None = None
        self.lock = threading.Lock()

    def add_gpu_rows(self, rows: list[tuple]) -> None:
        with self.lock:
            self.rows.extend(rows)

    def add_event(self, kind: str, **fields: Any) -> None:
        with self.lock:
            self.events.append({"kind": kind, **fields})

    def note_simulated(self, flag: bool) -> None:
        self.simulated = flag


class _Remember(logging.Handler):
    """Keeps what the plugin logged, for the JSON."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def decode_throttle(bits: int | None) -> list[str]:
    if bits is None:
        return ["?"]
    names = [name for bit, name in THROTTLE_BITS.items() if bits & bit]
    unknown = bits & ~sum(THROTTLE_BITS)
    if unknown:
        names.append(hex(unknown))
    return names or ["none"]


def host_facts() -> dict[str, Any]:
    """What NVML says about the host and each GPU, beside the sampler's readings."""
    import pynvml

    facts: dict[str, Any] = {"gpus": {}}
    pynvml.nvmlInit()
    try:
        for key, read in (("driver", pynvml.nvmlSystemGetDriverVersion),
                          ("nvml", pynvml.nvmlSystemGetNVMLVersion),
                          ("cuda_driver", pynvml.nvmlSystemGetCudaDriverVersion)):
            try:
                facts[key] = read()
            except Exception as exc:
                facts[key] = f"unreadable: {type(exc).__name__}"
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpu: dict[str, Any] = {}
            for key, read in (
                ("name", lambda h: pynvml.nvmlDeviceGetName(h)),
                ("uuid", lambda h: pynvml.nvmlDeviceGetUUID(h)),
                ("power_limit_w", lambda h: pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000),
                ("memory_total_mib", lambda h: pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**20),
                ("max_sm_clock_mhz",
                 lambda h: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)),
                ("ecc_mode_current", lambda h: pynvml.nvmlDeviceGetEccMode(h)[0]),
                ("supported_event_types", lambda h: hex(pynvml.nvmlDeviceGetSupportedEventTypes(h))),
            ):
                try:
                    value = read(handle)
                    gpu[key] = value.decode() if isinstance(value, bytes) else value
                except Exception as exc:
                    gpu[key] = f"unreadable: {type(exc).__name__}"
            facts["gpus"][index] = gpu
    finally:
        pynvml.nvmlShutdown()
    return facts


def training_load(stop: threading.Event, results: dict[int, dict[str, float]]) -> list[threading.Thread]:
    """One thread per CUDA device running a small bf16 matmul model with SGD until ``stop``."""
    try:
        import torch
    except ImportError:
        print("torch is not installed: sampling without a load")
        return []
    if not torch.cuda.is_available():
        print("CUDA is not available to torch: sampling without a load")
        return []

    def train(device: int) -> None:
        torch.cuda.set_device(device)
        size = 8192
        weight = torch.nn.Parameter(torch.randn(size, size, device=device, dtype=torch.bfloat16)
                                    / math.sqrt(size))
        optimiser = torch.optim.SGD([weight], lr=1e-4)
        inputs = torch.randn(size, size, device=device, dtype=torch.bfloat16)
        steps, began = 0, time.perf_counter()
        while not stop.is_set():
            for _ in range(10):
                loss = (inputs @ weight).float().pow(2).mean()
                loss.backward()
                optimiser.step()
                optimiser.zero_grad(set_to_none=True)
            torch.cuda.synchronize(device)
            steps += 10
        seconds = time.perf_counter() - began
        # forward and two backward matmuls per step
        results[device] = {"steps": steps, "seconds": seconds,
                           "tflops": 3 * 2 * size**3 * steps / seconds / 1e12}

    threads = [threading.Thread(target=train, args=(device,), daemon=True, name=f"load-{device}")
               for device in range(torch.cuda.device_count())]
    for thread in threads:
        thread.start()
    return threads


def summarise(rows: list[tuple], phases: dict[str, tuple[float, float]]) -> dict[int, Any]:
    by_gpu: dict[int, list[tuple]] = {}
    for row in rows:
        by_gpu.setdefault(row[1], []).append(row)
    summary: dict[int, Any] = {}
    for gpu, gpu_rows in sorted(by_gpu.items()):
        stamps = [row[0] for row in gpu_rows]
        gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
        per_phase: dict[str, Any] = {}
        for phase, (start, end) in phases.items():
            in_phase = [row for row in gpu_rows if start <= row[0] < end]
            columns: dict[str, Any] = {"samples": len(in_phase)}
            for index, name in enumerate(GPU_COLUMNS[2:7], start=2):
                values = [row[index] for row in in_phase if row[index] is not None]
                columns[name] = ({"mean": round(statistics.mean(values), 1),
                                  "min": round(min(values), 1), "max": round(max(values), 1)}
                                 if values else None)
            bits = 0
            for row in in_phase:
                bits |= row[7] or 0
            columns["throttle_seen"] = decode_throttle(bits)
            per_phase[phase] = columns
        summary[gpu] = {
            "samples": len(gpu_rows),
            "null_counts": {name: sum(row[i] is None for row in gpu_rows)
                            for i, name in enumerate(GPU_COLUMNS) if i >= 2},
            "tick_gap_s": ({"median": round(statistics.median(gaps), 3),
                            "min": round(min(gaps), 3), "max": round(max(gaps), 3)}
                           if gaps else None),
            "phases": per_phase,
        }
    return summary


def print_table(summary: dict[int, Any], events: list[dict[str, Any]]) -> None:
    header = (f"{'gpu':>3} {'phase':<9} {'n':>4} {'temp °C':>13} {'power W':>15} {'util %':>7} "
              f"{'mem MiB':>9} {'SM MHz':>11}  throttle reasons")
    print(header)
    print("-" * len(header))

    def span(column: dict[str, float] | None) -> str:
        return f"{column['mean']:.0f} ({column['min']:.0f}-{column['max']:.0f})" if column else "null"

    def mean(column: dict[str, float] | None) -> str:
        return f"{column['mean']:.0f}" if column else "null"

    for gpu, gpu_summary in summary.items():
        for phase, columns in gpu_summary["phases"].items():
            print(f"{gpu:>3} {phase:<9} {columns['samples']:>4} {span(columns['temp_c']):>13} "
                  f"{span(columns['power_w']):>15} {mean(columns['util_pct']):>7} "
                  f"{mean(columns['mem_used_mb']):>9} {span(columns['sm_clock_mhz']):>11}  "
                  f"{','.join(columns['throttle_seen'])}")
        nulls = {k: v for k, v in gpu_summary["null_counts"].items() if v}
        print(f"    tick gaps {gpu_summary['tick_gap_s']}; null readings {nulls or 'none'}")
    ecc = [e for e in events if e["kind"] == "ecc"]
    xids = [e for e in events if e["kind"] == "xid"]
    print(f"ECC events: {len(ecc)}  {ecc[:5]}")
    print(f"XID events: {len(xids)}  {xids[:5]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--no-load", action="store_true", help="sample without the CUDA load")
    parser.add_argument("--out", help="JSON path (default $OUT/gpu_check.json or ./gpu_check.json)")
    parser.add_argument("--simulated", action="store_true",
                        help="run against the simulated sensor: checks this script, not a GPU")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    out = Path(args.out) if args.out else Path(os.environ.get("OUT", ".")) / "gpu_check.json"

    recorder = Recorder()
    said = _Remember()
    logging.getLogger("runwatch").addHandler(said)
    sampler = GpuSampler(recorder, interval_s=args.interval, simulated=args.simulated, seed=0)
    if not sampler.start():
        print("No NVIDIA GPU, driver or nvidia-ml-py on this machine: nothing to check.")
        out.write_text(json.dumps({"status": "no_gpu", "log": said.messages}, indent=2))
        print(f"wrote {out}")
        return 0

    sensor = sampler.sensor
    report: dict[str, Any] = {"status": "ok", "interval_s": args.interval,
                              "simulated": recorder.simulated,
                              "xid_events_watched": bool(getattr(sensor, "xid_events", False))}
    try:
        report["host"] = "simulated" if args.simulated else host_facts()
    except Exception as exc:
        report["host"] = f"unreadable: {type(exc).__name__}: {exc}"
    if args.simulated:
        sensor.busy = False  # type: ignore[union-attr]  # follows the load phases below

    stop_load = threading.Event()
    load_results: dict[int, dict[str, float]] = {}
    began = time.time()
    idle_s = min(IDLE_S, args.seconds / 4)
    cool_s = min(COOL_DOWN_S, args.seconds / 8)
    load_s = max(0.0, args.seconds - idle_s - cool_s)
    threads: list[threading.Thread] = []
    try:
        time.sleep(idle_s)
        load_began = time.time()
        if args.simulated:
            sensor.busy = True  # type: ignore[union-attr]
        elif not args.no_load:
            threads = training_load(stop_load, load_results)
        time.sleep(load_s)
        stop_load.set()
        if args.simulated:
            sensor.busy = False  # type: ignore[union-attr]
        for thread in threads:
            thread.join(30)
        load_ended = time.time()
        time.sleep(cool_s)
    finally:
        stop_load.set()
        stopping = time.monotonic()
        sampler.stop()
        report["stop_s"] = round(time.monotonic() - stopping, 3)

    loaded = bool(threads) or args.simulated
    phases = {"idle": (began, load_began), "load" if loaded else "no-load": (load_began, load_ended),
              "cool-down": (load_ended, time.time() + 1)}
    with recorder.lock:
        rows, events = list(recorder.rows), list(recorder.events)
    report["load"] = load_results
    report["summary"] = summarise(rows, phases)
    report["events"] = events
    report["rows"] = [dict(zip(GPU_COLUMNS, row, strict=True)) for row in rows]
    report["log"] = said.messages

    print_table(report["summary"], events)
    print(f"XID events watched: {report['xid_events_watched']}; sampler stopped in "
          f"{report['stop_s']} s; load: {load_results or 'none'}")
    out.write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
