"""Which index a day partition of GPU samples should carry: btree (run_id, ts), BRIN (ts) or
BRIN (run_id, ts), measured on one real day of the dashboard benchmark's data.

    .venv/bin/python bench/partition_indexes.py [--db runwatch_bench_dash] [--rounds 5]

Needs the database `make bench-dashboard` loads. It copies the fullest GPU-sample day partition
into a scratch table with its hosts spread over 8 runs of 64 GPUs each (so that, as on a shared
cluster, one run's rows sit between other runs' rows of the same seconds), then for each index:
the time to build it, its size, the rate of appending 500k rows (INSERT ... SELECT, the index kept
up to date), and the median time (over --rounds, alternating the indexes) of the reads the pages
make of raw samples: a short window of one run (a zoomed chart), one run's newest sample (the runs
list and the failures page), and one run's whole hour (a power or GPU-health detail view).
Drops its scratch tables at the end. Figures on a shared 2-core machine are noisy: compare ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from urllib.parse import urlsplit

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from _pages import database_url  # noqa: E402

INDEXES = {
    "btree (run_id, ts)": "CREATE INDEX {name}_ix ON {name} (run_id, ts)",
    "BRIN (ts)": "CREATE INDEX {name}_ix ON {name} USING brin (ts)",
    "BRIN (run_id, ts)": "CREATE INDEX {name}_ix ON {name} USING brin (run_id, ts)",
}
RUNS = 8


def timed(conn, sql: str, params=None) -> float:
    started = time.perf_counter()
    conn.execute(sql, params).fetchall() if sql.lstrip().upper().startswith("SELECT") else (
        conn.execute(sql, params))
    return (time.perf_counter() - started) * 1000


def main(argv: list[str] | None = None) -> int:
    import psycopg

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="runwatch_bench_dash")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    url = database_url(args.db)
    print(f"database {urlsplit(url).path.lstrip('/')}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET jit = off")
        day = conn.execute("""
            SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = 'collectors_gpusample'::regclass
            ORDER BY c.reltuples DESC LIMIT 1""").fetchone()
        if day is None:
            raise SystemExit("no GPU-sample partition: run `make bench-dashboard` first")
        day = day[0]
        tables = {kind: f"bench_ix_{i}" for i, kind in enumerate(INDEXES)}
        build, size, append = {}, {}, {}
        for kind, name in tables.items():
            conn.execute(f"DROP TABLE IF EXISTS {name}")
            # 8 runs side by side in time: the host picks the run.
            conn.execute(f"""CREATE TABLE {name} AS
                SELECT (substr(host, 5)::int % {RUNS}) + 1 AS run_id, host, gpu, ts, temp_c,
                       power_w, util_pct FROM {day} ORDER BY ts""")
            build[kind] = timed(conn, INDEXES[kind].format(name=name))
            conn.execute(f"VACUUM ANALYZE {name}")
            size[kind] = conn.execute(
                f"SELECT pg_relation_size('{name}_ix')").fetchone()[0] / 2**20
        rows = conn.execute(f"SELECT count(*), min(ts), max(ts) FROM {tables['BRIN (ts)']}"
                            ).fetchone()
        count, first, last = rows
        print(f"{day}: {count:,} rows as {RUNS} interleaved runs, {first:%Y-%m-%d %H:%M} .. "
              f"{last:%H:%M} UTC")
        middle = first + (last - first) / 2
        queries = {
            "10 min of one run": (
                "SELECT ts, power_w FROM {name} WHERE run_id = 3 AND ts >= %s AND ts < %s",
                [middle, middle + (last - first) / 144]),
            "one run's newest row": (
                "SELECT ts FROM {name} WHERE run_id = 3 ORDER BY ts DESC LIMIT 1", None),
            "1 h of one run, mean": (
                "SELECT avg(power_w) FROM {name} WHERE run_id = 3 AND ts >= %s AND ts < %s",
                [middle, middle + (last - first) / 24]),
        }
        timings = {(kind, q): [] for kind in tables for q in queries}
        for _ in range(args.rounds):
            for kind, name in tables.items():  # alternating, so load drifts hit all alike
                for label, (sql, params) in queries.items():
                    timings[kind, label].append(timed(conn, sql.format(name=name), params))
        for kind, name in tables.items():
            # Appending: 500k rows of the next seconds, with the index kept up to date.
            started = time.perf_counter()
            conn.execute(f"""INSERT INTO {name}
                SELECT run_id, host, gpu, ts + interval '1 day', temp_c, power_w, util_pct
                FROM {name} ORDER BY ts LIMIT 500000""")
            append[kind] = 500_000 / (time.perf_counter() - started)
            conn.execute(f"DROP TABLE {name}")
        partition_counts = partition_count_costs(conn, args.rounds)
    print(f"{'index':<20} {'build s':>8} {'MiB':>7} {'append rows/s':>14} "
          + " ".join(f"{label:>22}" for label in queries))
    for kind in tables:
        cells = " ".join(f"{statistics.median(timings[kind, q]):>19.2f} ms" for q in queries)
        print(f"{kind:<20} {build[kind] / 1000:>8.1f} {size[kind]:>7.1f} {append[kind]:>14,.0f} "
              f"{cells}")
    print()
    print("partition count (day partitions of collectors_stepmetric; extra ones are empty days "
          "in 2200)")
    print(f"{'partitions':>10} {'newest row of one run':>22} {'newest row of every run':>24}")
    for count, (one, every) in partition_counts.items():
        print(f"{count:>10} {one:>19.2f} ms {every:>21.2f} ms")
    return 0


def partition_count_costs(conn, rounds: int) -> dict[int, tuple[float, float]]:
    """What the number of day partitions costs the reads that cannot be pruned by time (the runs
    list's newest row per run, the failures page's per-attempt ends): each probes every
    partition's index. Empty partitions are added far in the future, timed, and dropped."""
    one = "SELECT ts FROM collectors_stepmetric WHERE run_id = %s ORDER BY ts DESC LIMIT 1"
    every = ("SELECT r.id, (SELECT ts FROM collectors_stepmetric s WHERE s.run_id = r.id "
             "ORDER BY ts DESC LIMIT 1) FROM collectors_run r")
    run = conn.execute("SELECT run_id FROM collectors_stepmetric LIMIT 1").fetchone()[0]
    base = 84000  # days since 1970: the year 2200
    added: list[str] = []
    found = {}
    for extra in (0, 30, 90, 360):
        while len(added) < extra:
            day = base + len(added)
            name = f"collectors_stepmetric_bench_{day}"
            conn.execute(f"CREATE TABLE {name} PARTITION OF collectors_stepmetric FOR VALUES "
                         f"FROM (to_timestamp({day * 86400})) TO (to_timestamp({(day + 1) * 86400}))")
            added.append(name)
        count = conn.execute("SELECT count(*) FROM pg_inherits WHERE inhparent = "
                             "'collectors_stepmetric'::regclass").fetchone()[0]
        found[count] = (statistics.median(timed(conn, one, [run]) for _ in range(rounds * 4)),
                        statistics.median(timed(conn, every) for _ in range(rounds)))
    for name in added:
        conn.execute(f"DROP TABLE {name}")
    return found


if __name__ == "__main__":
    sys.exit(main())
