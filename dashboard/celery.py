"""The one Celery app, configured from Django settings (CELERY_* names)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

app = Celery("runwatch")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["collectors", "collectors.alerts"])
