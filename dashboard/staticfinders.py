"""Serves plotly.js from the installed plotly package as static/vendor/plotly.min.js."""

from __future__ import annotations

from pathlib import Path

import plotly
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
STATIC_PATH = "vendor/plotly.min.js"


class PlotlyJsFinder(BaseFinder):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.storage = FileSystemStorage(location=str(PLOTLY_JS.parent))

    def check(self, **kwargs):
        return []

    def find(self, path, find_all=False, **kwargs):
        if path != STATIC_PATH:
            return [] if find_all else None
        return [str(PLOTLY_JS)] if find_all else str(PLOTLY_JS)

    def list(self, ignore_patterns):
        yield PLOTLY_JS.name, _Prefixed(self.storage)


class _Prefixed(FileSystemStorage):
    """Wraps the package folder so collectstatic writes the file under vendor/."""

    def __init__(self, inner: FileSystemStorage):
        super().__init__(location=inner.location)
        self.prefix = "vendor"
