from __future__ import annotations

from django.urls import path

from dashboard.views import failures, runs

urlpatterns = [
    path("", runs.runs_list, name="runs"),
    path("runs.json", runs.runs_json, name="runs_json"),
    path("runs/<int:run_id>/", runs.run_page, name="run"),
    path("runs/<int:run_id>/series.json", runs.run_series, name="run_series"),
    path("runs/<int:run_id>/failures/", failures.run_failures, name="run_failures"),
    path("runs/<int:run_id>/failures/<int:interruption_id>/label", failures.label_interruption,
         name="label_interruption"),
    path("runs/<int:run_id>/checkpoints/", failures.run_checkpoints, name="run_checkpoints"),
]
