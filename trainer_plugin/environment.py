"""Where this process runs and where it reports to, read once from the environment.

Explicit arguments win over RUNWATCH_* variables; rank and world size come from the variables
torchrun (torch.distributed.run) sets for every worker, so a plain `torchrun train.py` needs no
extra configuration. Nothing here raises: a malformed variable is logged and replaced by its
default, because a typo in a launcher script must not stop a training job.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger("runwatch")


@dataclass(frozen=True)
class Environment:
    project: str | None
    run: str | None
    url: str | None
    token: str | None
    rank: int
    local_rank: int
    world_size: int
    attempt: int
    host: str


def _int_var(environ: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        log.warning("Runwatch: ignoring %s=%r (not an integer); using %d", name, raw, default)
        return default
    if value < minimum:
        log.warning("Runwatch: ignoring %s=%r (below %d); using %d", name, raw, minimum, default)
        return default
    return value


def _str_var(explicit: str | None, environ: Mapping[str, str], name: str) -> str | None:
    if explicit:
        return explicit
    value = environ.get(name, "").strip()
    return value or None


def detect(
    *,
    project: str | None = None,
    run: str | None = None,
    url: str | None = None,
    token: str | None = None,
    attempt: int | None = None,
    host: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Environment:
    environ = os.environ if environ is None else environ
    if attempt is None:
        # RUNWATCH_ATTEMPT lets a scheduler that restarts jobs itself (Slurm requeue) number them;
        # torchrun's own restart counter is the fallback for elastic restarts.
        if environ.get("RUNWATCH_ATTEMPT", "").strip():
            attempt = _int_var(environ, "RUNWATCH_ATTEMPT", 0, 0)
        else:
            attempt = _int_var(environ, "TORCHELASTIC_RESTART_COUNT", 0, 0)
    world_size = _int_var(environ, "WORLD_SIZE", 1, 1)
    rank = _int_var(environ, "RANK", 0, 0)
    if rank >= world_size:
        log.warning("Runwatch: RANK=%d is not below WORLD_SIZE=%d; reporting as rank 0 of 1",
                    rank, world_size)
        rank, world_size = 0, 1
    return Environment(
        project=_str_var(project, environ, "RUNWATCH_PROJECT"),
        run=_str_var(run, environ, "RUNWATCH_RUN"),
        url=_str_var(url, environ, "RUNWATCH_URL"),
        token=_str_var(token, environ, "RUNWATCH_TOKEN"),
        rank=rank,
        local_rank=_int_var(environ, "LOCAL_RANK", 0, 0),
        world_size=world_size,
        attempt=attempt,
        host=host or socket.gethostname() or "unknown",
    )
