"""Fills HostMinute and GpuHour from the GpuMinute rows already stored, so runs ingested before
0008 keep their Power and GPU health pages (ingest keeps both current from here on). The SQL is
frozen here rather than imported from collectors.rollups, which may change after this migration."""

from django.db import migrations

HOST_SQL = """
INSERT INTO collectors_hostminute (run_id, host, minute, gpus, power_samples, power_mean_sum,
                                   power_min_sum, power_max_sum, temp_n, temp_sum)
SELECT run_id, host, minute, count(*) FILTER (WHERE power_n > 0),
       coalesce(sum(samples) FILTER (WHERE power_n > 0), 0),
       coalesce(sum(power_sum / power_n) FILTER (WHERE power_n > 0), 0),
       coalesce(sum(power_min) FILTER (WHERE power_n > 0), 0),
       coalesce(sum(power_max) FILTER (WHERE power_n > 0), 0),
       sum(temp_n), sum(temp_sum)
FROM collectors_gpuminute
GROUP BY run_id, host, minute
ON CONFLICT DO NOTHING
"""
# Throttled counts only minutes whose bits include a throttling reason (0x4|0x8|0x20|0x40|0x80),
# as GPU health reads GpuMinute.
HOUR_SQL = """
INSERT INTO collectors_gpuhour (run_id, host, gpu, hour, samples, temp_n, temp_sum, temp_max,
                                power_n, power_sum, power_min, power_max, util_n, util_sum,
                                clock_n, clock_sum, clock_min, throttled, throttle_bits)
SELECT run_id, host, gpu, date_trunc('hour', minute), sum(samples), sum(temp_n), sum(temp_sum),
       max(temp_max), sum(power_n), sum(power_sum), min(power_min), max(power_max), sum(util_n),
       sum(util_sum), sum(clock_n), sum(clock_sum), min(clock_min),
       coalesce(sum(throttled) FILTER (WHERE throttle_bits & 236 <> 0), 0), bit_or(throttle_bits)
FROM collectors_gpuminute
GROUP BY run_id, host, gpu, date_trunc('hour', minute)
ON CONFLICT DO NOTHING
"""


def fill(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            # Hours of UTC whatever the session's zone; room to aggregate in memory.
            cursor.execute("SET LOCAL TimeZone = 'UTC'")
            cursor.execute("SET LOCAL work_mem = '256MB'")
            cursor.execute(HOST_SQL)
            cursor.execute(HOUR_SQL)
        return
    _fill_portably(apps)


def _fill_portably(apps):
    """SQLite (the embedded mode, small): the same sums in Python over the historical models."""
    GpuMinute = apps.get_model("collectors", "GpuMinute")
    HostMinute = apps.get_model("collectors", "HostMinute")
    GpuHour = apps.get_model("collectors", "GpuHour")
    hosts, hours = {}, {}
    for m in GpuMinute.objects.all().iterator():
        h = hosts.setdefault((m.run_id, m.host, m.minute), HostMinute(
            run_id=m.run_id, host=m.host, minute=m.minute))
        if m.power_n > 0:
            h.gpus += 1
            h.power_samples += m.samples
            h.power_mean_sum += m.power_sum / m.power_n
            h.power_min_sum += m.power_min
            h.power_max_sum += m.power_max
        h.temp_n += m.temp_n
        h.temp_sum += m.temp_sum
        hour = m.minute.replace(minute=0, second=0, microsecond=0)
        g = hours.setdefault((m.run_id, m.host, m.gpu, hour), GpuHour(
            run_id=m.run_id, host=m.host, gpu=m.gpu, hour=hour))
        for name in ("samples", "temp_n", "temp_sum", "power_n", "power_sum", "util_n",
                     "util_sum", "clock_n", "clock_sum"):
            setattr(g, name, getattr(g, name) + getattr(m, name))
        for name, pick in (("temp_max", max), ("power_min", min), ("power_max", max),
                           ("clock_min", min)):
            value, seen = getattr(m, name), getattr(g, name)
            if value is not None:
                setattr(g, name, value if seen is None else pick(seen, value))
        if m.throttle_bits & 236:
            g.throttled += m.throttled
        g.throttle_bits |= m.throttle_bits
    HostMinute.objects.bulk_create(hosts.values(), batch_size=1000)
    GpuHour.objects.bulk_create(hours.values(), batch_size=1000)


class Migration(migrations.Migration):

    dependencies = [
        ("collectors", "0008_host_minute_gpu_hour"),
    ]

    operations = [
        migrations.RunPython(fill, migrations.RunPython.noop),
    ]
