"""A production Celery worker whose pool processes run under cProfile, for
``bench/ingest_e2e.py --profile``.

    python bench/profiled_worker.py PROFILE_DIR <celery worker arguments>

Each pool process profiles itself from the moment it starts to its shutdown and writes
PROFILE_DIR/pool-<pid>.prof: the whole process, so the message decoding and acknowledgement that
happen around the ingest task show up beside the task itself. Nothing in the product is changed.
"""

from __future__ import annotations

import cProfile
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    profile_dir = Path(sys.argv[1])
    worker_args = sys.argv[2:]
    from celery.signals import worker_process_init, worker_process_shutdown

    from dashboard.celery import app

    profiler = cProfile.Profile()

    @worker_process_init.connect(weak=False)
    def _start(**_kwargs):
        profiler.enable()

    @worker_process_shutdown.connect(weak=False)
    def _stop(**_kwargs):
        profiler.disable()
        profiler.dump_stats(str(profile_dir / f"pool-{os.getpid()}.prof"))

    app.worker_main(["worker", *worker_args])


if __name__ == "__main__":
    main()
