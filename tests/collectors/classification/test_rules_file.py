"""The shipped rule file is valid: real category slugs, known fields, compiling regexes."""

from __future__ import annotations

import json
import re

import pytest

from collectors.classification import xid
from collectors.classification.rules import (
    CATEGORY_SLUGS,
    FIELDS,
    RULES_FILE,
    RuleFileError,
    read_rule_file,
    rules_from_file,
)
from collectors.models import Category, ClassificationRule


def test_rule_file_categories_are_the_design_slugs():
    assert set(CATEGORY_SLUGS) == set(Category.values)
    _, entries = read_rule_file()
    assert {entry["category"] for entry in entries} <= set(Category.values)


def test_every_rule_has_a_known_field_a_compiling_regex_and_a_unique_slug():
    version, entries = read_rule_file()
    assert version == 1
    assert set(FIELDS) == set(ClassificationRule.Field.values)
    slugs = [entry["slug"] for entry in entries]
    assert len(slugs) == len(set(slugs))
    for entry in entries:
        assert entry["field"] in FIELDS, entry["slug"]
        re.compile(entry["pattern"])
        assert 0 < entry["confidence"] <= 1, entry["slug"]
        assert entry["description"], entry["slug"]


def test_rules_are_ordered_highest_priority_first():
    priorities = [rule.priority for rule in rules_from_file()]
    assert priorities == sorted(priorities, reverse=True)


def test_a_bad_rule_file_names_every_problem(tmp_path):
    bad = tmp_path / "rules.json"
    bad.write_text(json.dumps({"version": 1, "rules": [
        {"slug": "a", "priority": 1, "category": "gpu_melted", "field": "text", "pattern": "x"},
        {"slug": "b", "priority": 1, "category": "host", "field": "text", "pattern": "(unclosed"},
        {"slug": "b", "priority": 1, "category": "host", "field": "smell", "pattern": "x"},
    ]}))
    with pytest.raises(RuleFileError) as raised:
        read_rule_file(bad)
    message = str(raised.value)
    assert "gpu_melted" in message
    assert "does not compile" in message
    assert "smell" in message
    assert "more than once" in message


def test_rule_file_path_is_versioned():
    assert RULES_FILE.name == "rules_v1.json"


@pytest.mark.parametrize(("code", "category"), [
    (13, "software_bug"), (31, "software_bug"), (43, "software_bug"),
    (48, "gpu_memory"), (63, "gpu_memory"), (64, "gpu_memory"), (94, "gpu_memory"),
    (95, "gpu_memory"), (74, "gpu_hardware"), (79, "gpu_hardware"), (119, "gpu_hardware"),
    (120, "gpu_hardware"), (45, None), (9999, None),
])
def test_xid_catalogue_maps_codes_to_categories(code, category):
    assert xid.category_of(code) == category


def test_xid_catalogue_categories_are_design_slugs():
    assert {info.category for info in xid.XID_CATALOGUE.values()} - {None} <= set(Category.values)


def test_xids_are_read_from_kernel_log_lines():
    text = ("NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.\n"
            "NVRM: Xid (0000:01:00): 13, 0005 00000000\nXID 48 An uncorrectable double bit error\n"
            "NVRM: Xid (PCI:0000:06:00): 79, again")
    assert xid.xids_in_text(text) == [79, 13, 48]
