"""Accuracy of the shipped rules on real error excerpts from public bug reports (corpus.jsonl).

Each corpus line cites the issue it was taken from. The rules were written from the error
signatures (NCCL, CUDA, kernel, torchrun, scheduler messages), not fitted line by line."""

from __future__ import annotations

import json
from pathlib import Path

from bench.classifier_accuracy import evaluate, format_table
from collectors.models import Category

CORPUS = Path(__file__).with_name("corpus.jsonl")
MIN_ACCURACY = 0.85


def corpus() -> list[dict]:
    return [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]


def test_corpus_is_real_cited_and_broad():
    entries = corpus()
    assert len(entries) >= 40
    assert all(entry["source"].startswith("https://") for entry in entries)
    assert all(entry["category"] in Category.values for entry in entries)
    assert all(entry["text"].strip() for entry in entries)
    assert len({entry["category"] for entry in entries}) >= 10


def test_corpus_accuracy_per_category(capsys):
    table, misses = evaluate(CORPUS)
    with capsys.disabled():
        print("\n" + format_table(table))
    total = sum(count for count, _ in table.values())
    correct = sum(right for _, right in table.values())
    assert correct / total >= MIN_ACCURACY, [(e["source"], v.category) for e, v in misses]
