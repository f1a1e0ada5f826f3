"""Rules in the database: loaded from the file at first use, editable in the admin, admin wins."""

from __future__ import annotations

import pytest
from django.contrib.admin.sites import site
from django.core.management import call_command
from django.test import RequestFactory

from collectors.classification.engine import classify
from collectors.classification.rules import read_rule_file, sync_rules_from_file
from collectors.interruptions import reclassify
from collectors.models import Attempt, ClassificationRule, Interruption, Project, Run

pytestmark = pytest.mark.django_db

OOM = {"text": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"}


def test_first_use_loads_the_file_into_an_empty_table():
    assert not ClassificationRule.objects.exists()
    assert classify(OOM).category == "gpu_oom"
    _, entries = read_rule_file()
    assert ClassificationRule.objects.count() == len(entries)
    assert set(ClassificationRule.objects.values_list("origin", flat=True)) == {"file"}


def test_loadrules_command_syncs_and_is_idempotent(capsys):
    call_command("loadrules")
    call_command("loadrules")
    _, entries = read_rule_file()
    assert ClassificationRule.objects.count() == len(entries)
    assert f"updated: {len(entries)}" in capsys.readouterr().out


def _admin_save(rule: ClassificationRule, superuser) -> None:
    request = RequestFactory().post("/admin/")
    request.user = superuser
    site._registry[ClassificationRule].save_model(request, rule, form=None, change=True)


def test_admin_edited_rule_overrides_the_file_and_survives_a_sync(django_user_model):
    admin_user = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    sync_rules_from_file()
    rule = ClassificationRule.objects.get(slug="cuda-oom")
    rule.category = "software_bug"  # this team treats OOM as its own bug (batch size)
    rule.confidence = 0.5
    _admin_save(rule, admin_user)

    counts = sync_rules_from_file()

    rule.refresh_from_db()
    assert (rule.origin, rule.category) == ("admin", "software_bug")
    assert counts["kept_admin"] == 1
    result = classify(OOM)
    assert (result.category, result.rule, result.confidence) == ("software_bug", "cuda-oom", 0.5)


def test_deleting_the_admin_edit_restores_the_file_rule(django_user_model):
    admin_user = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    sync_rules_from_file()
    rule = ClassificationRule.objects.get(slug="cuda-oom")
    rule.enabled = False
    _admin_save(rule, admin_user)
    assert classify(OOM).category != "gpu_oom"

    rule.delete()
    sync_rules_from_file()
    assert classify(OOM).category == "gpu_oom"


def test_a_new_admin_rule_can_beat_the_shipped_ones():
    sync_rules_from_file()
    ClassificationRule.objects.create(
        slug="our-flaky-nfs", priority=200, category="storage", field="text",
        pattern=r"/mnt/flaky-nfs/", description="our NFS mount", origin="admin")
    result = classify({"text": "RuntimeError: CUDA out of memory while reading /mnt/flaky-nfs/shard"})
    assert (result.category, result.rule) == ("storage", "our-flaky-nfs")


def test_a_broken_pattern_in_the_table_is_skipped_not_fatal():
    sync_rules_from_file()
    ClassificationRule.objects.create(slug="broken", priority=500, category="host", field="text",
                                      pattern="(unclosed", origin="admin")
    assert classify(OOM).category == "gpu_oom"


def test_rule_form_validation_rejects_bad_regex_and_category():
    from django.core.exceptions import ValidationError

    rule = ClassificationRule(slug="bad", priority=1, category="gpu_melted", field="text",
                              pattern="(unclosed")
    with pytest.raises(ValidationError) as raised:
        rule.full_clean()
    assert "does not compile" in str(raised.value)


def test_reclassify_after_a_rule_change_keeps_the_engineers_label(django_user_model):
    engineer = django_user_model.objects.create_user("ada")
    project = Project.objects.create(slug="llm")
    run = Run.objects.create(project=project, name="r")
    attempt = Attempt.objects.create(run=run, number=0)
    from django.utils import timezone

    interruption = Interruption.objects.create(
        run=run, attempt=attempt, ts=timezone.now(), source="exception",
        evidence={"text": "RuntimeError: something the rules do not know yet: XYZZY-42"},
        label_category="storage", labelled_by=engineer, labelled_at=timezone.now())
    reclassify(interruption)
    assert interruption.category == "software_bug"

    ClassificationRule.objects.create(slug="xyzzy", priority=300, category="network", field="text",
                                      pattern="XYZZY-42", origin="admin")
    reclassify(interruption)
    interruption.refresh_from_db()
    assert (interruption.category, interruption.rule) == ("network", "xyzzy")
    assert interruption.evidence["matched"].endswith("XYZZY-42")
    assert interruption.effective_category == "storage"
    assert interruption.labelled_by == engineer


def test_first_use_tolerates_a_concurrent_load(monkeypatch):
    from django.db import IntegrityError

    from collectors.classification import rules

    def racing_sync(path=rules.RULES_FILE):
        rules.sync_rules_from_file.__wrapped__(path)  # the other worker's load, committed first
        raise IntegrityError("duplicate key value violates unique constraint")

    racing_sync.__wrapped__ = rules.sync_rules_from_file
    monkeypatch.setattr(rules, "sync_rules_from_file", racing_sync)
    assert classify(OOM).category == "gpu_oom"
