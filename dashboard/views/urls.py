from __future__ import annotations

from django.urls import path

from dashboard.views import alerts, cluster, cluster_time, failures, runs

urlpatterns = [
    path("", runs.runs_list, name="runs"),
    path("runs.json", runs.runs_json, name="runs_json"),
    path("runs/<int:run_id>/", runs.run_page, name="run"),
    path("runs/<int:run_id>/series.json", runs.run_series, name="run_series"),
    path("runs/<int:run_id>/failures/", failures.run_failures, name="run_failures"),
    path("runs/<int:run_id>/failures/<int:interruption_id>/label", failures.label_interruption,
         name="label_interruption"),
    path("runs/<int:run_id>/checkpoints/", failures.run_checkpoints, name="run_checkpoints"),
    path("runs/<int:run_id>/power/", cluster.run_power, name="run_power"),
    path("runs/<int:run_id>/power.json", cluster.run_power_json, name="run_power_json"),
    path("runs/<int:run_id>/gpus/", cluster.run_gpu_health, name="run_gpu_health"),
    path("runs/<int:run_id>/gpus.json", cluster.run_gpu_health_json, name="run_gpu_health_json"),
    path("runs/<int:run_id>/time-of-day/", cluster_time.run_time_of_day, name="run_time_of_day"),
    path("runs/<int:run_id>/time-of-day.json", cluster_time.run_time_of_day_json,
         name="run_time_of_day_json"),
    path("runs/<int:run_id>/stragglers/", cluster_time.run_stragglers, name="run_stragglers"),
    path("runs/<int:run_id>/stragglers.json", cluster_time.run_stragglers_json,
         name="run_stragglers_json"),
    path("alerts/", alerts.alerts_page, name="alerts"),
    path("alerts/history/", alerts.history, name="alert_history"),
    path("alerts/rules/new", alerts.rule_new, name="alert_rule_new"),
    path("alerts/rules/<int:rule_id>/", alerts.rule_edit, name="alert_rule_edit"),
    path("alerts/channels/new", alerts.channel_new, name="alert_channel_new"),
    path("alerts/channels/<int:channel_id>/", alerts.channel_edit, name="alert_channel_edit"),
    path("alerts/channels/<int:channel_id>/test", alerts.channel_test, name="alert_channel_test"),
]
