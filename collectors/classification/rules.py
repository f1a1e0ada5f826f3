"""Classification rules: loaded from the versioned file ``rules_v1.json`` and kept in the
``ClassificationRule`` table, where an admin can edit them.

How the file and the table relate (kept deliberately simple):

* The file is the shipped default. ``sync_rules_from_file()`` (run by ``manage.py loadrules``, and
  automatically the first time rules are needed while the table is empty) writes every file rule
  into the table with ``origin="file"``, and deletes ``origin="file"`` rows whose slug left the file.
* Saving a rule in the admin marks it ``origin="admin"``. A sync never touches an admin row, so an
  admin edit of a shipped rule (same slug) wins over the file until the admin deletes that row; the
  next sync then restores the file's version.
* ``active_rules()`` returns the enabled rows of the table, compiled, highest priority first.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RULES_FILE = Path(__file__).with_name("rules_v1.json")

# What a rule's regex is searched in; see engine.evidence_values for how each is rendered.
FIELDS = ("text", "exc_type", "exit_code", "signal", "xid", "ecc_dbe", "heartbeat")

CATEGORY_SLUGS = (
    "gpu_hardware", "gpu_memory", "gpu_oom", "network", "nccl_timeout", "host", "host_maintenance",
    "storage", "dataloader", "software_bug", "numerical", "planned", "unknown",
)


class RuleFileError(ValueError):
    """The rule file (or a rule row) is not valid; the message lists every problem."""


@dataclass(frozen=True)
class Rule:
    slug: str
    priority: int
    category: str
    field: str
    pattern: str
    expected: bool = False
    confidence: float = 0.5
    description: str = ""
    version: int = 1
    origin: str = "file"
    regex: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        # Case-insensitive, and ^/$ anchor at line boundaries: logs are many lines.
        object.__setattr__(self, "regex", re.compile(self.pattern, re.IGNORECASE | re.MULTILINE))


def rule_problems(entry: dict[str, Any]) -> list[str]:
    """What is wrong with one rule given as a dict (file entry or form data); empty if valid."""
    slug = entry.get("slug") or "?"
    problems = []
    if not entry.get("slug"):
        problems.append("a rule has no slug")
    if entry.get("category") not in CATEGORY_SLUGS:
        problems.append(f"rule {slug}: category {entry.get('category')!r} is not one of "
                        f"{', '.join(CATEGORY_SLUGS)}")
    if entry.get("field") not in FIELDS:
        problems.append(f"rule {slug}: field {entry.get('field')!r} is not one of {', '.join(FIELDS)}")
    try:
        re.compile(entry.get("pattern") or "")
        if not entry.get("pattern"):
            problems.append(f"rule {slug}: the pattern is empty")
    except re.error as error:
        problems.append(f"rule {slug}: pattern does not compile ({error})")
    confidence = entry.get("confidence", 0.5)
    if not isinstance(confidence, int | float) or not 0 <= confidence <= 1:
        problems.append(f"rule {slug}: confidence must be a number between 0 and 1")
    if not isinstance(entry.get("priority"), int):
        problems.append(f"rule {slug}: priority must be an integer")
    return problems


def read_rule_file(path: Path = RULES_FILE) -> tuple[int, list[dict[str, Any]]]:
    """The file's version and rule entries; raises RuleFileError naming every problem."""
    document = json.loads(Path(path).read_text())
    version = document.get("version")
    entries = document.get("rules")
    if not isinstance(version, int) or not isinstance(entries, list):
        raise RuleFileError(f"{path}: expected {{'version': int, 'rules': [...]}}")
    problems = [p for entry in entries for p in rule_problems(entry)]
    slugs = [entry.get("slug") for entry in entries]
    problems += [f"rule {s}: slug used more than once" for s in sorted({s for s in slugs
                                                                         if slugs.count(s) > 1})]
    if problems:
        raise RuleFileError(f"{path}: " + "; ".join(problems))
    return version, entries


def _sorted(rules: list[Rule]) -> list[Rule]:
    # Ties are broken by slug so that the order, and so every verdict, is deterministic.
    return sorted(rules, key=lambda rule: (-rule.priority, rule.slug))


def rules_from_file(path: Path = RULES_FILE) -> list[Rule]:
    """The file's rules, compiled and ordered, without touching the database."""
    version, entries = read_rule_file(path)
    return _sorted([
        Rule(slug=e["slug"], priority=e["priority"], category=e["category"], field=e["field"],
             pattern=e["pattern"], expected=bool(e.get("expected", False)),
             confidence=float(e.get("confidence", 0.5)), description=e.get("description", ""),
             version=version)
        for e in entries if e.get("enabled", True)
    ])


def sync_rules_from_file(path: Path = RULES_FILE) -> dict[str, int]:
    """Writes the file's rules into the table (see the module docstring). Returns counts."""
    from django.db import transaction

    from collectors.models import ClassificationRule

    version, entries = read_rule_file(path)
    counts = {"created": 0, "updated": 0, "kept_admin": 0, "deleted": 0}
    with transaction.atomic():
        admin_slugs = set(ClassificationRule.objects.filter(origin=ClassificationRule.Origin.ADMIN)
                          .values_list("slug", flat=True))
        for entry in entries:
            if entry["slug"] in admin_slugs:
                counts["kept_admin"] += 1
                continue
            _, created = ClassificationRule.objects.update_or_create(
                slug=entry["slug"],
                defaults={
                    "version": version, "priority": entry["priority"],
                    "category": entry["category"], "expected": bool(entry.get("expected", False)),
                    "confidence": float(entry.get("confidence", 0.5)), "field": entry["field"],
                    "pattern": entry["pattern"], "enabled": entry.get("enabled", True),
                    "description": entry.get("description", ""),
                    "origin": ClassificationRule.Origin.FILE,
                },
            )
            counts["created" if created else "updated"] += 1
        stale = ClassificationRule.objects.filter(origin=ClassificationRule.Origin.FILE).exclude(
            slug__in=[entry["slug"] for entry in entries])
        counts["deleted"] = stale.delete()[0]
    return counts


def active_rules() -> list[Rule]:
    """The enabled rules of the table, compiled and ordered; the file's when the table is empty.

    A row whose pattern no longer compiles (edited outside the admin form) is skipped with a
    warning rather than taking the whole classifier down."""
    from django.db import IntegrityError

    from collectors.models import ClassificationRule

    if not ClassificationRule.objects.exists():
        try:
            sync_rules_from_file()
        except IntegrityError:
            # Another worker loaded them at the same moment; its rows are what we read below. The
            # sync runs in its own savepoint, so the caller's transaction is still usable.
            log.info("classification rules were loaded concurrently by another worker")
    rules = []
    for row in ClassificationRule.objects.filter(enabled=True):
        try:
            rules.append(Rule(slug=row.slug, priority=row.priority, category=row.category,
                              field=row.field, pattern=row.pattern, expected=row.expected,
                              confidence=row.confidence, description=row.description,
                              version=row.version, origin=row.origin))
        except re.error as error:
            log.warning("classification rule %s is skipped: its pattern does not compile (%s)",
                        row.slug, error)
    return _sorted(rules)
