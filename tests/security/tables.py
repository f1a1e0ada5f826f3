"""Row counts of every table the collectors write, to prove that refused input wrote nothing."""

from __future__ import annotations

from django.apps import apps


def table_counts() -> dict[str, int]:
    models = [*apps.get_app_config("collectors").get_models(),
              *apps.get_app_config("alerts").get_models()]
    return {model._meta.db_table: model.objects.count() for model in models}


def changed(before: dict[str, int], after: dict[str, int]) -> dict[str, tuple[int, int]]:
    return {name: (before[name], after[name]) for name in before if before[name] != after[name]}
