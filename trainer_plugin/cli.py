"""``runwatch``: the plugin's command line.

    runwatch sync DIR [--url URL] [--token TOKEN]

sends every batch spooled under DIR (a spool root such as ``~/.cache/runwatch/spool``, a run's
directory, or one rank's) to the collector, oldest first within each rank's directory, with a
progress bar on stderr and a summary at the end. A file is deleted only once the collector has
accepted it (200/202); the collectors store each batch id once, so running sync twice, or beside a
live Monitor replaying the same files, never stores anything twice. Exit status 0 when nothing is
left, 1 when something is (the collector is away: run it again later), 2 for bad usage.

Standard library only: tqdm draws the bar when it is installed, else a plain one is drawn.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from trainer_plugin.protocol import row_count
from trainer_plugin.sender import split_in_halves
from trainer_plugin.spool import Spool, default_root, find_spools
from trainer_plugin.transports import PermanentSendError, TransientSendError, transport_for

#: Transient failures of one batch before sync stops (the collector is away: try again later).
SYNC_TRIES = 3


@dataclass
class SyncSummary:
    batches_sent: int = 0
    rows_sent: int = 0
    failed: int = 0  # refused by the collector: renamed *.rejected, not retried
    remaining: int = 0  # still spooled: not tried, or the collector stayed away

    def line(self) -> str:
        return (f"runwatch sync: sent {self.batches_sent} batches ({self.rows_sent} rows), "
                f"{self.failed} refused, {self.remaining} remaining")


class _PlainBar:
    """A progress bar for a terminal without tqdm: one line on stderr, redrawn in place."""

    def __init__(self, total: int, stream: TextIO):
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream
        self._draw()

    def update(self, n: int) -> None:
        self.done += n
        self._draw()

    def _draw(self) -> None:
        width = 30
        filled = int(width * min(self.done, self.total) / self.total)
        self.stream.write(f"\rsyncing [{'#' * filled}{'.' * (width - filled)}] "
                          f"{self.done}/{self.total} batches")
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


def _progress_bar(total: int, stream: TextIO) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return _PlainBar(total, stream)
    return tqdm(total=total, unit="batch", desc="syncing", file=stream)


def sync(directory: Path, transport: Any, *, stream: TextIO = sys.stderr,
         sleep: Callable[[float], None] = time.sleep) -> SyncSummary:
    """Sends everything spooled under ``directory`` through ``transport``; see the module doc."""
    spools = [Spool(path, max_bytes=1 << 62) for path in find_spools(directory)]
    summary = SyncSummary()
    total = sum(len(spool) for spool in spools)
    bar = _progress_bar(total, stream)
    try:
        for spool in spools:
            if not _sync_one(spool, transport, summary, bar, sleep):
                break  # the collector is away: the rest would fail the same way
    finally:
        bar.close()
    summary.remaining = sum(len(spool) for spool in spools)
    return summary


def _sync_one(spool: Spool, transport: Any, summary: SyncSummary, bar: Any,
              sleep: Callable[[float], None]) -> bool:
    for name in spool.names():
        batch = spool.load(name)
        if batch is None:
            bar.update(1)
            continue
        outcome = _deliver(batch, transport, sleep)
        if outcome is None:
            return False
        sent, refused = outcome
        if refused:
            summary.failed += 1
            path = spool.directory / name
            try:
                os.replace(path, path.with_name(name + ".rejected"))
            except OSError:
                pass
            spool.remove(name)
        else:
            summary.batches_sent += 1
            summary.rows_sent += sent
            spool.remove(name)
        bar.update(1)
    return True


def _deliver(batch: dict[str, Any], transport: Any, sleep: Callable[[float], None],
             ) -> tuple[int, bool] | None:
    """(rows sent, refused?) for one batch; None when the collector stayed away."""
    for attempt in range(SYNC_TRIES):
        try:
            transport.send(batch)
            return row_count(batch), False
        except PermanentSendError as error:
            if error.status == 413 and row_count(batch) > 1:
                sent = 0
                for half in split_in_halves(batch):
                    outcome = _deliver(half, transport, sleep)
                    if outcome is None or outcome[1]:
                        return outcome
                    sent += outcome[0]
                return sent, False
            print(f"\nrunwatch sync: the collector refused batch {batch.get('batch_id')}: {error}",
                  file=sys.stderr)
            return 0, True
        except TransientSendError as error:
            if attempt + 1 == SYNC_TRIES:
                print(f"\nrunwatch sync: {error}; stopping, run it again later", file=sys.stderr)
                return None
            delay = error.retry_after if error.retry_after is not None else 2.0 ** attempt
            sleep(min(delay, 30.0))
    return None


def _command_sync(args: argparse.Namespace) -> int:
    url = args.url or os.environ.get("RUNWATCH_URL", "").strip()
    token = args.token or os.environ.get("RUNWATCH_TOKEN", "").strip() or None
    if not url:
        print("runwatch sync: say where to send: --url http://collector:8000 (or set RUNWATCH_URL)",
              file=sys.stderr)
        return 2
    directory = Path(args.directory).expanduser()
    if not directory.is_dir():
        print(f"runwatch sync: {directory} is not a directory; pass a spool directory such as "
              f"{default_root()}", file=sys.stderr)
        return 2
    try:
        transport = transport_for(url, token)
    except ValueError as error:
        print(f"runwatch sync: {error}", file=sys.stderr)
        return 2
    try:
        summary = sync(directory, transport)
    finally:
        transport.close()
    print(summary.line())
    return 0 if summary.remaining == 0 and summary.failed == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="runwatch", description="Runwatch's training-side tools.")
    commands = parser.add_subparsers(dest="command", required=True)
    sync_parser = commands.add_parser(
        "sync", help="send spooled batches (offline mode, or left by a collector outage)",
        description="Send every batch spooled under DIR, oldest first; delete each once accepted.")
    sync_parser.add_argument("directory", metavar="DIR", help="a spool directory (any level)")
    sync_parser.add_argument("--url", help="the collector (default: RUNWATCH_URL)")
    sync_parser.add_argument("--token", help="the project's ingest token (default: RUNWATCH_TOKEN)")
    args = parser.parse_args(argv)
    if args.command == "sync":
        return _command_sync(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
