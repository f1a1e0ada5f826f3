"""The one Celery app, configured from Django settings (CELERY_* names)."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import task_postrun, task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

app = Celery("runwatch")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["collectors", "collectors.alerts"])


@task_prerun.connect
@task_postrun.connect
def close_old_database_connections(task=None, **_kwargs) -> None:
    """Around each task, what Django does around each request: keep the connection, unless it
    saw an error, is older than CONN_MAX_AGE or fails its health check (settings.CELERY_DB_REUSE_MAX
    stops Celery from closing it every time). Not for eager tasks: they run inside a request,
    whose transaction may be open."""
    if task is not None and getattr(task.request, "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()
