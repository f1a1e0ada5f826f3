from django.apps import AppConfig


class CollectorsConfig(AppConfig):
    name = "collectors"
    verbose_name = "Collected data"

    def ready(self) -> None:
        # A Celery worker signal: workers that decode zstd read the ingest.zstd queue too.
        from collectors import zstd_ingest  # noqa: F401
