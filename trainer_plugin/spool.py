"""The spool: batches that could not be delivered yet, kept on local disk and sent later in order.

Layout: one directory per process identity, ``<root>/<project>/<run>/rank-<rank>/``, where the root
is ``RUNWATCH_SPOOL_DIR`` or ``~/.cache/runwatch/spool``. Ranks never share a directory, so the
ranks of one job (even on a shared home directory) never touch each other's files; the next process
of the same rank (a torchrun restart, a requeued job) finds its predecessor's leftovers there and
sends them first.

One file is one v1 batch, gzip-compressed JSON, named

    <created_ns:020d>-<pid>-<part>-<rows>-<e|d>.json.gz

``created_ns`` is when the sender made the batch (strictly increasing within a process), so the
lexical order of names is the order batches were made, whenever they were written: a batch moved
from memory to disk late still sorts before newer ones. ``e`` marks a batch holding events
(interruptions, checkpoints, start/finish: never dropped), ``d`` a batch of step and GPU rows only.

Writes are atomic: the batch goes to a hidden temporary file in the same directory, which is
fsynced and then renamed into place, so a crash leaves either the whole batch or nothing under a
real name (the directory is fsynced too where the platform allows it; a power loss may still forget
the newest rename, never expose half a file).

The size bound (``RUNWATCH_SPOOL_MAX_MB``, default 1024) is kept by deleting the oldest ``d``
files first; ``e`` files are never deleted for space, so a spool holding only events may exceed it.
Deleted rows are counted and logged. Standard library only.
"""

from __future__ import annotations

import bisect
import gzip
import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer_plugin.protocol import make_batch, row_count

log = logging.getLogger("runwatch")

DEFAULT_MAX_MB = 1024
SUFFIX = ".json.gz"
_NAME = re.compile(r"^(?P<ns>\d{20})-(?P<pid>\d+)-(?P<part>\d+)-(?P<rows>\d+)-(?P<flag>[ed])\.json\.gz$")
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def default_root(environ: dict[str, str] | os._Environ | None = None) -> Path:
    environ = os.environ if environ is None else environ
    explicit = environ.get("RUNWATCH_SPOOL_DIR", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    return Path("~/.cache/runwatch/spool").expanduser()


def max_bytes_from_env(environ: dict[str, str] | os._Environ | None = None) -> int:
    environ = os.environ if environ is None else environ
    raw = environ.get("RUNWATCH_SPOOL_MAX_MB", "").strip()
    if raw:
        try:
            value = float(raw)
            if value > 0:
                return int(value * 1024 * 1024)
        except ValueError:
            pass
        log.warning("Runwatch: ignoring RUNWATCH_SPOOL_MAX_MB=%r (not a positive number); using %d",
                    raw, DEFAULT_MAX_MB)
    return DEFAULT_MAX_MB * 1024 * 1024


def directory_for(root: Path, project: str, run: str, rank: int) -> Path:
    """The spool directory of one rank of one run; names are made safe for any file system."""
    return root / _SAFE.sub("_", project) / _SAFE.sub("_", run) / f"rank-{int(rank)}"


@dataclass(frozen=True)
class SpoolFile:
    name: str
    rows: int
    has_events: bool


def parse_name(name: str) -> SpoolFile | None:
    match = _NAME.match(name)
    if match is None:
        return None
    return SpoolFile(name, int(match["rows"]), match["flag"] == "e")


def has_data(batch: dict[str, Any]) -> bool:
    return bool(batch["steps"]["step"] or batch["gpus"]["ts"])


def split_events(batch: dict[str, Any]) -> list[dict[str, Any]]:
    """A batch with both events and rows as two batches (events first), so that the rows may be
    dropped for space without the events. Only for batches never sent: new batch ids."""
    if not batch["events"] or not has_data(batch):
        return [batch]
    events = make_batch(run=batch["run"], source=batch["source"], events=batch["events"])
    data = make_batch(run=batch["run"], source=batch["source"], steps=batch["steps"],
                      gpus=batch["gpus"])
    return [events, data]


def encode(batch: dict[str, Any]) -> bytes:
    raw = json.dumps(batch, separators=(",", ":"), allow_nan=False).encode("utf-8")
    return gzip.compress(raw, compresslevel=1)


def decode(blob: bytes) -> dict[str, Any]:
    return json.loads(gzip.decompress(blob))


class Spool:
    """One spool directory. Thread-safe: the sender thread writes and replays, a signal handler
    on the main thread may write an interruption straight to disk."""

    def __init__(self, directory: Path | str, max_bytes: int | None = None):
        self.directory = Path(directory)
        self.max_bytes = max_bytes if max_bytes is not None else max_bytes_from_env()
        self._lock = threading.RLock()
        self._names: list[str] = []
        self._sizes: dict[str, int] = {}
        self._last_ns = 0
        self.batches_written = 0
        self.rows_written = 0
        self.batches_deleted = 0  # dropped for space
        self.rows_deleted = 0
        self.directory.mkdir(parents=True, exist_ok=True)
        self.rescan()

    # --- what is there ------------------------------------------------------------------------

    def rescan(self) -> None:
        names, sizes = [], {}
        for entry in os.scandir(self.directory):
            if parse_name(entry.name) is None:
                continue
            try:
                sizes[entry.name] = entry.stat().st_size
            except FileNotFoundError:
                continue
            names.append(entry.name)
        with self._lock:
            self._names = sorted(names)
            self._sizes = sizes

    def __len__(self) -> int:
        return len(self._names)

    def names(self) -> list[str]:
        with self._lock:
            return list(self._names)

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    @property
    def rows(self) -> int:
        with self._lock:
            return sum(parse_name(name).rows for name in self._names)  # type: ignore[union-attr]

    def oldest(self) -> str | None:
        with self._lock:
            return self._names[0] if self._names else None

    # --- writing --------------------------------------------------------------------------------

    def next_ns(self, now_ns: int | None = None) -> int:
        """A creation stamp later than every earlier one of this spool object."""
        with self._lock:
            stamp = max(now_ns if now_ns is not None else _time_ns(), self._last_ns + 1)
            self._last_ns = stamp
            return stamp

    def write(self, batch: dict[str, Any], created_ns: int | None = None, part: int = 0) -> str | None:
        """Writes one batch atomically; returns its name, or None when it was a rows-only batch
        that did not fit even after deleting every older rows-only batch."""
        created_ns = created_ns if created_ns is not None else self.next_ns()
        rows = row_count(batch)
        flag = "e" if batch["events"] else "d"
        name = f"{created_ns:020d}-{os.getpid()}-{part}-{rows}-{flag}{SUFFIX}"
        blob = encode(batch)
        with self._lock:
            if not self._make_room(len(blob), keep_new=flag == "e"):
                _warn_full(self)
                return None  # the caller counts it
            temporary = self.directory / f".{name}.tmp"
            with open(temporary, "wb") as handle:
                handle.write(blob)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self.directory / name)
            _fsync_directory(self.directory)
            bisect.insort(self._names, name)
            self._sizes[name] = len(blob)
            self.batches_written += 1
            self.rows_written += rows
            return name

    def _make_room(self, needed: int, keep_new: bool) -> bool:
        total = sum(self._sizes.values())
        if total + needed <= self.max_bytes:
            return True
        for name in list(self._names):
            if total + needed <= self.max_bytes:
                break
            info = parse_name(name)
            if info is None or info.has_events:
                continue
            self._forget(name, delete=True)
            total -= self._sizes.pop(name, 0)
            self.batches_deleted += 1
            self.rows_deleted += info.rows
            _warn_full(self)
        return keep_new or total + needed <= self.max_bytes

    # --- reading --------------------------------------------------------------------------------

    def load(self, name: str) -> dict[str, Any] | None:
        """The batch in ``name``, or None when it is gone (another process sent it) or unreadable
        (then it is renamed ``*.corrupt`` and left for a person to look at)."""
        path = self.directory / name
        try:
            return decode(path.read_bytes())
        except FileNotFoundError:
            self.remove(name)
            return None
        except (OSError, ValueError, EOFError) as error:
            log.warning("Runwatch: spooled batch %s is unreadable (%s); renamed to %s.corrupt",
                        path, error, name)
            try:
                os.replace(path, path.with_name(name + ".corrupt"))
            except OSError:
                pass
            self.remove(name)
            return None

    def remove(self, name: str) -> None:
        with self._lock:
            self._forget(name, delete=True)
            self._sizes.pop(name, None)

    def _forget(self, name: str, delete: bool) -> None:
        index = bisect.bisect_left(self._names, name)
        if index < len(self._names) and self._names[index] == name:
            del self._names[index]
        if delete:
            try:
                os.unlink(self.directory / name)
            except FileNotFoundError:
                pass


def find_spools(root: Path | str) -> list[Path]:
    """Every directory under ``root`` (itself included) holding spooled batches, sorted."""
    root = Path(root)
    found = []
    for directory, _subdirs, files in os.walk(root):
        if any(parse_name(name) for name in files):
            found.append(Path(directory))
    return sorted(found)


def _time_ns() -> int:
    import time

    return time.time_ns()


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_full_warned: set[str] = set()


def _warn_full(spool: Spool) -> None:
    key = str(spool.directory)
    if key in _full_warned:
        return
    _full_warned.add(key)
    log.warning("Runwatch: the spool %s is over its %d MB bound (RUNWATCH_SPOOL_MAX_MB); dropping "
                "the oldest step/GPU batches, never events", spool.directory,
                spool.max_bytes // (1024 * 1024))
