from __future__ import annotations

from django import forms
from django.contrib import admin

from collectors.alerts.forms import ChannelForm
from collectors.alerts.models import Alert, AlertRule, Channel, Notification


class ChannelAdminForm(ChannelForm):
    class Meta(ChannelForm.Meta):
        pass


@admin.register(Channel)
class ChannelAdmin(admin.ModelAdmin):
    # The config (webhook URL) is write-only here too: the form never renders it.
    form = ChannelAdminForm
    list_display = ("name", "project", "kind", "masked_target", "created_at")
    list_filter = ("kind", "project")
    search_fields = ("name",)

    def get_fields(self, request, obj=None):
        return ["project", "name", "kind", "recipients", "url"]

    @admin.display(description="Target")
    def masked_target(self, obj: Channel) -> str:
        return obj.masked_target


class AlertRuleAdminForm(forms.ModelForm):
    class Meta:
        model = AlertRule
        fields = "__all__"


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):
    form = AlertRuleAdminForm
    list_display = ("name", "project", "run", "kind", "parameters", "cooldown_minutes", "enabled")
    list_filter = ("kind", "enabled", "project")
    filter_horizontal = ("channels",)


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = ("rule", "run", "incident_key", "state", "opened_at", "resolved_at", "notified")
    list_filter = ("state",)
    readonly_fields = ("last_notified_at",)


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = ("created_at", "channel", "kind", "status", "attempts", "sent_at", "error")
    list_filter = ("status", "kind")
    readonly_fields = ("alert", "channel", "kind", "attempts", "status", "error", "created_at",
                       "last_attempt_at", "sent_at")
