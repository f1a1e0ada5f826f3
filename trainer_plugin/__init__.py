"""Runwatch's training-side plugin: ``from trainer_plugin import Monitor``.

Imports only the standard library: Celery is imported inside the redis:// transport when it is
first used, torch never (tensors are converted through ``float()``).
"""

from __future__ import annotations

from trainer_plugin.monitor import Monitor

__all__ = ["Monitor"]
