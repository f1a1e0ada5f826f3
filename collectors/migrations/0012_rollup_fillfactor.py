"""The rollup tables are updated in place by every batch that adds to a row (a GPU's hour by
sixty batches, a run's minute by every drain): free room on each page lets PostgreSQL write the new
version beside the old one as a heap-only tuple, with no new index entries and less for autovacuum
to clean (bench/README.md, "End-to-end ingest"). Applies to pages written from now on."""

from django.db import migrations

TABLES = ("collectors_stepminute", "collectors_gpuminute", "collectors_hostminute",
          "collectors_clusterminute", "collectors_gpuhour", "collectors_stepquarter")
FILLFACTOR = 70


def _alter(value: int | None):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            return  # SQLite has no fillfactor
        with schema_editor.connection.cursor() as cursor:
            for table in TABLES:
                if value is None:
                    cursor.execute(f'ALTER TABLE "{table}" RESET (fillfactor)')
                else:
                    cursor.execute(f'ALTER TABLE "{table}" SET (fillfactor = {value})')
    return run


class Migration(migrations.Migration):
    dependencies = [("collectors", "0011_cluster_minute")]

    operations = [migrations.RunPython(_alter(FILLFACTOR), _alter(None))]
