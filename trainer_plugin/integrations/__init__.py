"""Runwatch for existing trainers, each added in one line:

    Trainer(..., callbacks=[RunwatchCallback(project="llm", run="gpt2-small")])     # 🤗 transformers
    pl.Trainer(..., callbacks=[RunwatchCallback(project="llm", run="gpt2-small")])  # Lightning

``trainer_plugin.integrations.huggingface`` and ``trainer_plugin.integrations.lightning`` import
their library; this module imports neither, and holds what both callbacks share.
"""

from __future__ import annotations

import os
from typing import Any

from trainer_plugin.monitor import Monitor


def start_monitor(project: str | None, run: str | None, *, rank: int, local_rank: int,
                  world_size: int, config: dict[str, Any] | None,
                  monitor_kwargs: dict[str, Any]) -> Monitor:
    """A Monitor for this process, which the trainer knows to be ``rank`` of ``world_size``.

    The Monitor reads its rank from RANK, LOCAL_RANK and WORLD_SIZE, which torchrun, accelerate and
    deepspeed set; Lightning's own DDP launcher sets only LOCAL_RANK and WORLD_SIZE. Where the
    trainer knows more than the environment says, the environment is completed from the trainer
    (as Lightning's DeepSpeed strategy does itself), never overwritten."""
    if world_size > 1:
        os.environ.setdefault("RANK", str(rank))
        os.environ.setdefault("LOCAL_RANK", str(local_rank))
        os.environ.setdefault("WORLD_SIZE", str(world_size))
    return Monitor(project, run, config=config, **monitor_kwargs)


def record_exception(monitor: Monitor, exception: BaseException) -> None:
    """Records ``exception`` as the interruption that ended training and closes the monitor as
    failed: exactly what leaving ``with Monitor(...)`` with that exception does (so a KeyboardInterrupt
    after a recorded signal is not recorded twice, and sys.exit(0) is a clean end)."""
    monitor.__exit__(type(exception), exception, exception.__traceback__)


def path_bytes(path: str | os.PathLike[str]) -> int | None:
    """The size of a checkpoint: a file's, or the total of the files under a directory."""
    try:
        if os.path.isfile(path):
            return os.path.getsize(path)
        total = 0
        for root, _dirs, files in os.walk(path):
            for name in files:
                try:
                    total += os.path.getsize(os.path.join(root, name))
                except OSError:
                    pass
        return total if os.path.isdir(path) else None
    except OSError:
        return None
