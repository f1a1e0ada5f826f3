from __future__ import annotations

from django.contrib import admin, messages

from collectors.models import (
    Attempt,
    Checkpoint,
    ClassificationRule,
    Event,
    IngestedBatch,
    IngestToken,
    Project,
    RejectedBatch,
    Run,
)


class IngestTokenInline(admin.TabularInline):
    model = IngestToken
    extra = 0
    fields = ("prefix", "name", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "created_at", "last_used_at")
    can_delete = True


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "created_at")
    search_fields = ("slug", "name")
    filter_horizontal = ("members",)
    inlines = [IngestTokenInline]
    actions = ["issue_token"]

    @admin.action(description="Issue a new ingest token (shown once)")
    def issue_token(self, request, queryset):
        for project in queryset:
            _, plain = IngestToken.issue(project, name=f"admin:{request.user.username}")
            # Shown once, to the admin who asked; only its hash is stored.
            self.message_user(request, f"{project.slug}: {plain}", messages.WARNING)


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    readonly_fields = ("number", "started_at", "ended_at", "exit_reason")


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "status", "world_size", "last_step", "last_seen_at")
    list_filter = ("status", "project")
    search_fields = ("name",)
    inlines = [AttemptInline]


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ("kind", "run", "rank", "host", "ts")
    list_filter = ("kind",)
    list_select_related = ("run",)
    raw_id_fields = ("run", "attempt")


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ("kind", "run", "step", "ts", "duration_s", "bytes")
    list_filter = ("kind",)
    raw_id_fields = ("run", "attempt")


@admin.register(IngestedBatch)
class IngestedBatchAdmin(admin.ModelAdmin):
    list_display = ("batch_id", "run", "rank", "received_at", "steps", "gpu_samples", "events")
    raw_id_fields = ("run",)


@admin.register(RejectedBatch)
class RejectedBatchAdmin(admin.ModelAdmin):
    """The dead-letter list: what the collectors refused and why. A record of what happened, so
    nobody adds or edits one here; deleting old ones is allowed."""

    list_display = ("received_at", "reason_short", "field", "project", "batch_id")
    list_filter = ("project", "field", ("received_at", admin.DateFieldListFilter))
    search_fields = ("batch_id", "project", "reason", "field")
    date_hierarchy = "received_at"
    fields = ("received_at", "project", "batch_id", "field", "reason", "excerpt")
    readonly_fields = fields
    list_per_page = 50

    @admin.display(description="Reason", ordering="reason")
    def reason_short(self, obj: RejectedBatch) -> str:
        return obj.reason if len(obj.reason) <= 120 else obj.reason[:119] + "…"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ClassificationRule)
class ClassificationRuleAdmin(admin.ModelAdmin):
    """Root-cause rules. Saving one here marks it origin=admin, so that `loadrules` (a sync from
    rules_v1.json) keeps the edit instead of the file's version of the same slug."""

    list_display = ("slug", "priority", "category", "expected", "confidence", "field", "enabled",
                    "origin", "updated_at")
    list_filter = ("category", "field", "enabled", "origin")
    search_fields = ("slug", "pattern", "description")
    readonly_fields = ("origin", "updated_at")
    actions = ["load_from_file"]

    def save_model(self, request, obj, form, change):
        obj.origin = ClassificationRule.Origin.ADMIN
        super().save_model(request, obj, form, change)

    @admin.action(description="Reload the shipped rules from rules_v1.json (admin edits are kept)")
    def load_from_file(self, request, queryset):
        from collectors.classification.rules import sync_rules_from_file

        counts = sync_rules_from_file()
        self.message_user(request, ", ".join(f"{name}: {count}" for name, count in counts.items()))
