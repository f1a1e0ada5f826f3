"""Accuracy of the interruption classifier on the corpus of real error excerpts.

    python bench/classifier_accuracy.py [CORPUS.jsonl] [--misses]

Prints, per expected category, how many excerpts there are, how many the shipped rules
(collectors/classification/rules_v1.json) classify correctly, and the accuracy; then the overall
figure. Needs no database: the rules are read from the file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from collectors.classification.engine import classify  # noqa: E402
from collectors.classification.rules import rules_from_file  # noqa: E402

DEFAULT_CORPUS = ROOT / "tests" / "collectors" / "classification" / "corpus.jsonl"


def evaluate(corpus: Path) -> tuple[dict[str, list[int]], list[tuple[dict, object]]]:
    """Per category [count, correct], and the misses as (entry, verdict)."""
    rules = rules_from_file()
    table: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    misses = []
    for line in corpus.read_text().splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        verdict = classify({"text": entry["text"], "source": "launcher"}, rules=rules)
        row = table[entry["category"]]
        row[0] += 1
        if verdict.category == entry["category"]:
            row[1] += 1
        else:
            misses.append((entry, verdict))
    return dict(table), misses


def format_table(table: dict[str, list[int]]) -> str:
    lines = [f"{'category':<18}{'count':>7}{'correct':>9}{'accuracy':>10}"]
    for category in sorted(table):
        count, correct = table[category]
        lines.append(f"{category:<18}{count:>7}{correct:>9}{correct / count:>10.0%}")
    total = sum(count for count, _ in table.values())
    right = sum(correct for _, correct in table.values())
    lines.append(f"{'overall':<18}{total:>7}{right:>9}{right / total:>10.1%}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", nargs="?", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--misses", action="store_true", help="also list the misclassified excerpts")
    args = parser.parse_args()
    table, misses = evaluate(args.corpus)
    print(format_table(table))
    if args.misses:
        for entry, verdict in misses:
            print(f"\n{entry['source']}: expected {entry['category']}, got {verdict.category} "
                  f"by {verdict.rule}: {verdict.matched!r}")


if __name__ == "__main__":
    main()
