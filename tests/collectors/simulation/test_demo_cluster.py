"""make demo's simulated cluster (scripts/demo.py start_simulated_cluster), on the embedded mode's
SQLite: its history is there within seconds, and the demo's clean-up ends it cleanly."""

from __future__ import annotations

import importlib.util
import signal
import sqlite3
import time

from tests.e2e.conftest import ROOT, wait_for

_spec = importlib.util.spec_from_file_location("demo_script", ROOT / "scripts" / "demo.py")
demo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(demo)


def _query(path, sql: str, *params):
    with sqlite3.connect(path, timeout=30) as db:
        return db.execute(sql, params).fetchone()


def test_demo_cluster_shows_its_history_at_once_and_stops_cleanly_on_the_demos_signal(tmp_path):
    database = tmp_path / "demo.sqlite3"
    env = demo.embedded_env() | {"DATABASE_URL": f"sqlite:///{database}"}
    demo.manage(env, "migrate", "--noinput", "-v", "0")
    log = tmp_path / "cluster.log"
    began = time.time()
    cluster = demo.start_simulated_cluster(env, "sim-cluster-test", log_path=log)
    try:
        run_sql = "SELECT id FROM collectors_run WHERE name = 'sim-cluster-test'"

        def history_hours() -> float:
            row = _query(database, "SELECT min(ts), max(ts) FROM collectors_gpusample "
                                   f"WHERE run_id = ({run_sql})")
            if not row or row[0] is None:
                return 0.0
            from django.utils.dateparse import parse_datetime

            return (parse_datetime(row[1]) - parse_datetime(row[0])).total_seconds() / 3600

        # The first hours of history are stored an hour per batch: the pages have data at once.
        wait_for(lambda: history_hours() >= 1.0 or cluster.poll() is not None, timeout=90,
                 what="an hour of the simulated cluster's history")
        assert cluster.poll() is None, log.read_text()
        assert time.time() - began < 90
        timezone, status = _query(database, "SELECT timezone, status FROM collectors_run "
                                            "WHERE name = 'sim-cluster-test'")
        assert timezone == "America/Chicago" and status == "running"
        assert _query(database, "SELECT count(DISTINCT host) FROM collectors_gpusample "
                                f"WHERE run_id = ({run_sql})")[0] == 4
    finally:
        demo.stop(cluster, signal.SIGINT, grace_s=15, group=False)
    assert cluster.returncode == 0, log.read_text()
    assert "stopped" in log.read_text()
    assert _query(database, "SELECT status FROM collectors_run WHERE name = 'sim-cluster-test'")[0] \
        == "finished"
