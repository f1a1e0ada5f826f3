from __future__ import annotations

from django.urls import path

from dashboard.views import runs

urlpatterns = [
    path("", runs.runs_list, name="runs"),
    path("runs.json", runs.runs_json, name="runs_json"),
    path("runs/<int:run_id>/", runs.run_page, name="run"),
    path("runs/<int:run_id>/series.json", runs.run_series, name="run_series"),
]
