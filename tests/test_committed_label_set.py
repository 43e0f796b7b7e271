"""The committed ShareGPT label set has no twin across its split (checked without the prompt text)."""

import json
import os

import pytest

from specforge_outlets.data.label_set import read_packed

PACKED = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "data", "sharegpt-smollm2")


def _rows(stem):
    return read_packed(os.path.join(PACKED, f"{stem}.jsonl.gz"))


@pytest.mark.skipif(not os.path.exists(os.path.join(PACKED, "summary.json")), reason="no committed label set")
def test_no_prompt_or_prompt_group_is_in_both_train_and_test():
    train, test = _rows("train"), _rows("test")
    assert {r["id"] for r in train}.isdisjoint(r["id"] for r in test)
    assert {r["prompt_crc32"] for r in train}.isdisjoint(r["prompt_crc32"] for r in test)  # exact twins
    assert {r["prompt_group"] for r in train}.isdisjoint(r["prompt_group"] for r in test)  # normalised and near twins
    test_ids = {r["id"] for r in test}
    for seed in (1, 2, 3):  # the repeated samples answer test prompts only
        assert {r["id"] for r in _rows(f"noise-seed{seed}")} <= test_ids
    with open(os.path.join(PACKED, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    assert summary["train"]["packed_rows"] == len(train) and summary["test"]["packed_rows"] == len(test)


@pytest.mark.skipif(not os.path.exists(os.path.join(PACKED, "summary.json")), reason="no committed label set")
def test_every_prompt_is_answered_and_250_test_prompts_have_4_samples():
    with open(os.path.join(PACKED, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    assert all(summary[stem]["complete"] for stem in ("train", "test", "noise-seed1", "noise-seed2", "noise-seed3"))
    samples = {r["id"]: 1 for r in _rows("test")}  # the scored response is the first sample
    for seed in (1, 2, 3):
        for row in _rows(f"noise-seed{seed}"):
            samples[row["id"]] += 1
    assert sum(count >= 4 for count in samples.values()) >= 250
