from django.apps import AppConfig


class CollectorsConfig(AppConfig):
    name = "collectors"
    verbose_name = "Collected data"
