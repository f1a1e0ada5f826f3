"""python manage.py simulate --gpus N --days D --seed S: a simulated cluster's training run, stored
through the real ingest path, and the ground truth it planted."""

from __future__ import annotations

import json
import signal
import sys
import time
from datetime import UTC, datetime, timedelta
from datetime import time as dt_time
from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.core.validators import validate_slug
from django.utils.dateparse import parse_date, parse_datetime

from collectors.simulation import GroundTruth, SimConfig, run_simulation
from collectors.simulation.config import GPUS_PER_HOST
from collectors.simulation.run import SimulationError, check_config

#: Below this many GPU-days the GPUs are sampled every 10 s; above, every 60 s (a 512-GPU, 3-day
#: backfill then stores ~2.2M GPU samples instead of ~13M, which keeps it to minutes).
FINE_SAMPLING_GPU_DAYS = 64


def _start(value: str | None) -> datetime | None:
    if value is None:
        return None
    parsed = parse_datetime(value)
    if parsed is None:
        day = parse_date(value)
        if day is None:
            raise CommandError(f"--start {value!r} is not a date or datetime; use e.g. 2026-07-01 "
                               "or 2026-07-01T06:00:00Z")
        parsed = datetime.combine(day, dt_time())
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


class Command(BaseCommand):
    help = (
        "Simulates a GPU cluster's training run and stores it through the real ingest path "
        "(wire format v1 batches handed to collectors.tasks.ingest_batch), then prints the ground "
        "truth it planted: diurnal amplitude, hourly deviations, power swings with their cause, "
        "interruptions per category, ETTR, stragglers, hot GPUs. Backfills history as fast as the "
        "collectors take it; --live streams the part after now at wall-clock pace. Defaults keep a "
        "512-GPU, 3-day backfill to minutes: GPUs sampled every 10 s up to "
        f"{FINE_SAMPLING_GPU_DAYS} GPU-days and every 60 s above; every rank reports steps up to "
        "16 GPUs, above that local rank 0 of each host (more per host below 16 hosts, so that 16 "
        "healthy ranks report) plus the slow ranks."
    )

    def add_arguments(self, parser):
        parser.add_argument("--gpus", type=int, default=32, help="GPUs in the cluster, 8 per host "
                            "(rounded up to whole hosts). Default 32.")
        parser.add_argument("--days", type=float, default=1.0, help="length of the run. Default 1.")
        parser.add_argument("--seed", type=int, default=0, help="the same seed gives the same run.")
        parser.add_argument("--start", help="when the run starts (UTC unless an offset is given), "
                            "e.g. 2026-07-01 or 2026-07-01T06:00:00Z. Default: --days ago, so "
                            "the run ends now (with --live: --history hours ago).")
        parser.add_argument("--live", action="store_true", help="send what lies before now at "
                            "once, then stream the rest in real time (10 s batches) until the run "
                            "ends or Ctrl-C.")
        parser.add_argument("--history", type=float, default=1.0, metavar="HOURS",
                            help="with --live and no --start: hours of history before now. "
                            "Default 1.")
        parser.add_argument("--sample-interval", type=float, default=None, metavar="SECONDS",
                            help=f"GPU telemetry period. Default 10 s, 60 s above "
                            f"{FINE_SAMPLING_GPU_DAYS} GPU-days.")
        parser.add_argument("--step-ranks", choices=("auto", "all", "hosts"), default="auto",
                            help="which ranks report step rows: all, one per host (plus the slow "
                            "ranks), or auto (all up to 16 GPUs). Default auto.")
        parser.add_argument("--interruptions", type=int, default=None, metavar="N",
                            help="plant exactly N interruptions instead of drawing them at the "
                            "Llama 3 rate (419 in 54 days on 16,384 GPUs, scaled to --gpus).")
        parser.add_argument("--diurnal-slowdown", type=float, default=1.5, metavar="PCT",
                            help="peak-to-trough step-time slowdown with the day's heat. "
                            "Default 1.5.")
        parser.add_argument("--timezone", default="America/Chicago",
                            help="the site's time zone (IANA name). Default America/Chicago.")
        parser.add_argument("--project", default="sim", help="project slug. Default sim.")
        parser.add_argument("--run-name", default=None,
                            help="run name. Default sim-<gpus>gpu-<days>d-seed<seed>.")
        parser.add_argument("--token", default=None, help="an ingest token of the project "
                            "(default: a new one is made).")
        parser.add_argument("--via-broker", action="store_true", help="enqueue the batches for "
                            "running Celery workers (ingest_batch.delay) instead of storing them "
                            "in this process.")
        parser.add_argument("--truth-json", type=Path, default=None, metavar="PATH",
                            help="also write the ground truth as JSON to PATH.")
        parser.add_argument("--no-progress", action="store_true", help="no progress bar.")

    def handle(self, *args, **options):
        config = self._config(options)
        try:
            check_config(config)
        except SimulationError as error:
            raise CommandError(str(error)) from None
        truth_path: Path | None = options["truth_json"]
        if truth_path is not None and not truth_path.parent.is_dir():
            raise CommandError(f"--truth-json: the folder {truth_path.parent} does not exist")
        if config.via_broker:
            self._check_workers()

        bar = None
        if not options["no_progress"]:
            from tqdm import tqdm

            bar = tqdm(total=1000, file=sys.stderr, desc=f"simulating {config.run_name}",
                       bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed} elapsed, "
                                  "{remaining} left", mininterval=0.5)

        def progress(fraction: float) -> None:
            if bar is not None:
                bar.update(int(fraction * 1000) - bar.n)

        if config.live:
            # `kill`, a CI runner or `make demo` stopping us takes the same way out as Ctrl-C
            # (SIGINT set again: a shell without job control starts us with it ignored).
            signal.signal(signal.SIGTERM, signal.default_int_handler)
            signal.signal(signal.SIGINT, signal.default_int_handler)
        began = time.monotonic()
        try:
            truth = run_simulation(config, token=options["token"], progress=progress)
        except SimulationError as error:
            raise CommandError(str(error)) from None
        except KeyboardInterrupt:
            if bar is not None:
                bar.close()
            self.stderr.write(f"simulate: stopped; run {config.project}/{config.run_name} keeps "
                              "what was stored so far and is marked finished.")
            return
        finally:
            if bar is not None:
                bar.close()
        elapsed = time.monotonic() - began
        self.stdout.write(summary(truth, elapsed))
        data = truth.as_dict()
        self.stdout.write("ground truth (JSON):")
        self.stdout.write(json.dumps(data, indent=2))
        if truth_path is not None:
            truth_path.write_text(json.dumps(data, indent=2) + "\n")
            self.stderr.write(f"ground truth written to {truth_path}")

    def _config(self, options) -> SimConfig:
        gpus, days, seed = options["gpus"], options["days"], options["seed"]
        if gpus < 1:
            raise CommandError("--gpus must be at least 1")
        if not days > 0:
            raise CommandError("--days must be more than 0")
        try:
            validate_slug(options["project"])
        except ValidationError:
            raise CommandError(f"--project {options['project']!r} must be a slug: letters, digits, "
                               "'-' and '_'") from None
        start = _start(options["start"])
        live = options["live"]
        now = datetime.now(UTC).replace(microsecond=0)
        if start is None and live:
            if options["history"] < 0:
                raise CommandError("--history cannot be negative")
            start = now - timedelta(hours=options["history"])
        if start is not None and not live and start + timedelta(days=days) > now + timedelta(minutes=1):
            raise CommandError(f"a backfill must end by now, but --start {start.isoformat()} plus "
                               f"--days {days:g} ends later; start earlier, or add --live to "
                               "stream the rest as it happens")
        interval = options["sample_interval"]
        if interval is None:
            interval = 10.0 if gpus * days <= FINE_SAMPLING_GPU_DAYS else 60.0
        hosts = -(-gpus // GPUS_PER_HOST)
        step_ranks = None
        if options["step_ranks"] == "all":
            step_ranks = list(range(hosts * GPUS_PER_HOST))
        elif options["step_ranks"] == "hosts":
            step_ranks = [h * GPUS_PER_HOST for h in range(hosts)]
        run_name = options["run_name"] or f"sim-{gpus}gpu-{days:g}d-seed{seed}"
        return SimConfig(
            run_name=run_name, project=options["project"], gpus=gpus, days=days, seed=seed,
            start=start, site_timezone=options["timezone"], sample_interval_s=interval,
            diurnal_slowdown_pct=options["diurnal_slowdown"],
            interruptions=options["interruptions"], step_ranks=step_ranks, live=live,
            via_broker=options["via_broker"],
        )

    def _check_workers(self) -> None:
        from collectors.tasks import ingest_batch

        app = ingest_batch.app
        if app.conf.task_always_eager or not app.conf.broker_url:
            raise CommandError("--via-broker needs a broker: set CELERY_BROKER_URL and start a "
                               "worker (celery -A dashboard worker)")
        try:
            answers = app.control.ping(timeout=2.0)
        except Exception as error:  # the broker is down or unreachable
            raise CommandError(f"--via-broker: the broker did not answer ({error})") from None
        if not answers:
            raise CommandError("--via-broker: no Celery worker answered; start one with "
                               "`celery -A dashboard worker` or leave out --via-broker")


def summary(truth: GroundTruth, elapsed_s: float) -> str:
    details = truth.details
    rows = details.get("rows_sent", {})
    lines = [
        f"Simulated {truth.project}/{truth.run_name} (run id {truth.run_id}): {truth.gpus} GPUs on "
        f"{truth.hosts} hosts, {truth.start:%Y-%m-%d %H:%M} → {truth.end:%Y-%m-%d %H:%M} UTC, "
        f"site time zone {truth.site_timezone}",
        f"  stored in {elapsed_s:.1f} s: {rows.get('batches', 0):,} batches, "
        f"{rows.get('steps', 0):,} step rows, {rows.get('gpu_samples', 0):,} GPU samples, "
        f"{rows.get('events', 0):,} events",
        f"  steps: {details.get('steps', 0):,} over {details.get('attempts', 0)} attempt(s); "
        f"checkpoints every {details.get('checkpoint_every_steps')} steps "
        f"({details.get('checkpoints', 0)} saved)",
        f"  ETTR: {truth.ettr:.2%}",
        f"  throughput vs time of day: {truth.diurnal_amplitude_pct:.2f} percentage points peak "
        f"to trough",
    ]
    hourly = [f"{h:02d}h {d:+.2f}%" for h, d in enumerate(truth.hourly_deviation_pct)
              if d is not None]
    for i in range(0, len(hourly), 8):
        lines.append("    " + "  ".join(hourly[i:i + 8]))
    if truth.interruptions:
        parts = ", ".join(f"{c} {n}" for c, n in truth.interruptions.items())
        lines.append(f"  interruptions: {sum(truth.interruptions.values())} "
                     f"({truth.unexpected_interruptions} unexpected): {parts}")
    else:
        lines.append("  interruptions: none")
    lines.append("  largest power swings:")
    for swing in truth.swings[:5]:
        lines.append(f"    {swing['delta_kw']:+9.1f} kW at {swing['start'][:19]}Z ({swing['cause']})")
    for s in truth.stragglers:
        lines.append(f"  straggler: rank {s['rank']} ({s['host']} GPU {s['gpu']}), "
                     f"{s['slowdown']:.0%} slower")
    for g in truth.hot_gpus:
        lines.append(f"  hot GPU: {g['host']} GPU {g['gpu']}, +{g['extra_c']:g} °C"
                     + (", throttling" if g["throttling"] else ""))
    return "\n".join(lines)
