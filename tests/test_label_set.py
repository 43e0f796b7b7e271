"""The packed label set: responses without prompts, joined back to the prompts they answer."""

import json
import time

import pytest

from specforge_outlets.data.label_set import pack_label_set, read_packed, sample_noise_prompts, unpack_label_set
from specforge_outlets.errors import OutletsError
from specforge_outlets.model.tiny_chat_target import END_ID, make_chat_target
from tests.data_fixtures import read_jsonl, write_jsonl


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_chat_target(str(tmp_path_factory.mktemp("target")))


def _regenerated(tokenizer, prompt_rows, seed):
    rows = []
    for index, row in enumerate(prompt_rows):
        ids = [5 + (index + seed) % 7, 9, 11][: 1 + index % 3]
        censored = index % 4 == 3
        token_ids = ids if censored else ids + [END_ID]
        turn = {"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True),
                "num_tokens": len(token_ids), "finish_reason": "length" if censored else "stop",
                "token_ids": token_ids}
        rows.append({"id": row["id"], "conversations": [*row["conversations"], turn]})
    return rows


def test_pack_then_unpack_gives_the_regenerated_rows_back(target, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    data, regen, packed, restored = (tmp_path / name for name in ("data", "regen", "packed", "restored"))
    for folder in (data, regen):
        folder.mkdir()
    prompts = [{"id": f"p{i}", "conversations": [{"role": "user", "content": f"question {i}"}]} for i in range(8)]
    write_jsonl(data / "test.jsonl", prompts)
    sample_noise_prompts(str(data / "test.jsonl"), str(data / "noise.jsonl"), 3)
    noise = read_jsonl(data / "noise.jsonl")
    assert len(noise) == 3 and [r["id"] for r in noise] == sorted(r["id"] for r in noise)
    regenerated = {"test": _regenerated(tokenizer, prompts, 0), "noise-seed1": _regenerated(tokenizer, noise, 1)}
    for stem, rows in regenerated.items():
        write_jsonl(regen / f"{stem}.jsonl", [r for r in rows if r["conversations"][-1]["finish_reason"] == "stop"])
        write_jsonl(regen / f"{stem}.filtered.jsonl",
                    [{**r, "filtered": "turn 1 response is longer than 3 tokens"}
                     for r in rows if r["conversations"][-1]["finish_reason"] == "length"])
        (regen / f"{stem}.summary.json").write_text(json.dumps({  # a regeneration resumed from an unpacked set
            "kept": 1, "input": str(data / "test.jsonl"), "output": str(regen / f"{stem}.jsonl"),
            "unpacked_from": str(tmp_path / "elsewhere")}))
    pack_label_set(str(regen), ["test.jsonl", "noise-seed1.jsonl"], str(packed))
    summary = json.loads((packed / "summary.json").read_text())  # committed: no path of this machine
    assert str(tmp_path) not in json.dumps(summary) and "unpacked_from" not in summary["test"]
    assert (summary["test"]["input"], summary["test"]["output"]) == ("test.jsonl", "test.jsonl")
    packed_rows = read_packed(str(packed / "test.jsonl.gz"))
    first_bytes = (packed / "test.jsonl.gz").read_bytes()
    time.sleep(1.1)  # gzip stamps the time in seconds; an unchanged file must still pack to the same bytes
    pack_label_set(str(regen), ["test.jsonl", "noise-seed1.jsonl"], str(packed))
    assert (packed / "test.jsonl.gz").read_bytes() == first_bytes
    assert len(packed_rows) == 8 and "content" not in json.dumps(packed_rows)  # no text, prompt or response
    unpack_label_set(str(packed), str(data), str(restored), target)
    for stem in regenerated:
        for suffix in (".jsonl", ".filtered.jsonl"):
            original = sorted(read_jsonl(regen / f"{stem}{suffix}"), key=lambda r: r["id"])
            assert read_jsonl(restored / f"{stem}{suffix}") == original
    assert json.loads((restored / "test.summary.json").read_text())["unpacked_from"] == str(packed)


def test_unpack_refuses_labels_for_other_prompts(target, tmp_path):
    data, packed = tmp_path / "data", tmp_path / "packed"
    data.mkdir()
    regen = tmp_path / "regen"
    regen.mkdir()
    prompts = [{"id": f"p{i}", "conversations": [{"role": "user", "content": f"question {i}"}]} for i in range(3)]
    turn = {"role": "assistant", "content": "x", "num_tokens": 1, "finish_reason": "stop", "token_ids": [END_ID]}
    write_jsonl(regen / "test.jsonl", [{"id": r["id"], "conversations": [*r["conversations"], turn]} for r in prompts])
    (regen / "test.summary.json").write_text("{}")
    pack_label_set(str(regen), ["test.jsonl"], str(packed))
    prompts[1]["conversations"][0]["content"] = "another question"
    write_jsonl(data / "test.jsonl", prompts)
    with pytest.raises(OutletsError, match="id p1 has a different prompt in"):
        unpack_label_set(str(packed), str(data), str(tmp_path / "out"), target)
    write_jsonl(data / "test.jsonl", prompts[:1])
    with pytest.raises(OutletsError, match="id p1 is not in"):
        unpack_label_set(str(packed), str(data), str(tmp_path / "out"), target)
    assert not (tmp_path / "out" / "test.jsonl").exists()  # nothing half-written


def test_pack_refuses_rows_without_token_ids(tmp_path):
    write_jsonl(tmp_path / "test.jsonl", [{"id": "a", "conversations": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "x", "num_tokens": 1,
                                           "finish_reason": "stop"}]}])
    (tmp_path / "test.summary.json").write_text("{}")
    with pytest.raises(OutletsError, match="row a: assistant turn 1 has no token_ids"):
        pack_label_set(str(tmp_path), ["test.jsonl"], str(tmp_path / "packed"))


def test_a_partially_packed_file_is_left_for_resume(target, tmp_path):
    data, regen, packed, restored = (tmp_path / name for name in ("data", "regen", "packed", "restored"))
    for folder in (data, regen):
        folder.mkdir()
    prompts = [{"id": f"p{i}", "conversations": [{"role": "user", "content": f"question {i}"}]} for i in range(3)]
    write_jsonl(data / "train.jsonl", prompts)
    turn = {"role": "assistant", "content": "x", "num_tokens": 1, "finish_reason": "stop", "token_ids": [END_ID]}
    write_jsonl(regen / "train.jsonl", [{"id": "p0", "conversations": [*prompts[0]["conversations"], turn]}])
    pack_label_set(str(regen), ["train.jsonl"], str(packed))  # no train.summary.json: still running
    summary = json.loads((packed / "summary.json").read_text())["train"]
    assert summary == {"complete": False, "packed_rows": 1}
    unpack_label_set(str(packed), str(data), str(restored), target)
    assert [r["id"] for r in read_jsonl(restored / "train.jsonl")] == ["p0"]
    assert not (restored / "train.summary.json").exists()  # so `regenerate --resume` finishes it


def test_unpack_sends_each_response_to_its_prompts_current_split(target, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    data, regen, packed, restored = (tmp_path / name for name in ("data", "regen", "packed", "restored"))
    for folder in (data, regen):
        folder.mkdir()
    prompts = [{"id": f"p{i}", "conversations": [{"role": "user", "content": f"question {i}"}]} for i in range(8)]
    answered = _regenerated(tokenizer, prompts, 0)
    for stem, rows in (("train", answered[:5]), ("test", answered[5:7])):  # p7 is not answered yet
        write_jsonl(regen / f"{stem}.jsonl", rows)
        (regen / f"{stem}.summary.json").write_text("{}")
    write_jsonl(regen / "noise-seed1.jsonl", _regenerated(tokenizer, prompts[5:7], 1))
    (regen / "noise-seed1.summary.json").write_text("{}")
    pack_label_set(str(regen), ["train.jsonl", "test.jsonl", "noise-seed1.jsonl"], str(packed))
    # The re-split: p1 moves to test, p6 to train; p5 stays in test, and only p5 keeps its noise samples.
    split = {"train": [0, 2, 3, 4, 6], "test": [1, 5, 7]}
    for stem, indices in split.items():
        write_jsonl(data / f"{stem}.jsonl", [prompts[i] for i in indices])
    write_jsonl(data / "noise.jsonl", [prompts[5]])
    moved = unpack_label_set(str(packed), str(data), str(restored), target)
    assert moved == {"responses moved into train": 1, "responses moved into test": 1,
                     "noise-seed1 samples of prompts no longer in noise.jsonl": 1}
    ids = {stem: sorted(r["id"] for r in read_jsonl(restored / f"{stem}.jsonl") + read_jsonl(restored / f"{stem}.filtered.jsonl"))
           for stem in ("train", "test", "noise-seed1")}
    assert ids == {"train": ["p0", "p2", "p3", "p4", "p6"], "test": ["p1", "p5"], "noise-seed1": ["p5"]}
    assert (restored / "train.summary.json").exists() and (restored / "noise-seed1.summary.json").exists()
    assert not (restored / "test.summary.json").exists()  # p7 still to answer: `regenerate --resume` does it


def test_noise_prompts_keep_the_ones_already_sampled(tmp_path):
    prompts = [{"id": f"p{i}", "conversations": [{"role": "user", "content": f"q{i}"}]} for i in range(40)]
    write_jsonl(tmp_path / "test.jsonl", prompts)
    sample_noise_prompts(str(tmp_path / "test.jsonl"), str(tmp_path / "small.jsonl"), 10)
    sample_noise_prompts(str(tmp_path / "test.jsonl"), str(tmp_path / "large.jsonl"), 15)
    small, large = ({r["id"] for r in read_jsonl(tmp_path / f"{n}.jsonl")} for n in ("small", "large"))
    assert len(small) == 10 and len(large) == 15 and small < large  # growing the subset keeps it
    sample_noise_prompts(str(tmp_path / "test.jsonl"), str(tmp_path / "kept.jsonl"), 10, keep=["p0", "p1"])
    kept = {r["id"] for r in read_jsonl(tmp_path / "kept.jsonl")}
    assert {"p0", "p1"} <= kept and len(kept) == 10


def test_packed_rows_name_their_prompt_group_across_files(target, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    regen = tmp_path / "regen"
    regen.mkdir()
    prompts = [{"id": i, "conversations": [{"role": "user", "content": text}]}
               for i, text in (("a", "What is the capital of France?"), ("b", "Tell me a joke"),
                               ("c", "what is the capital of  FRANCE?"))]
    write_jsonl(regen / "train.jsonl", _regenerated(tokenizer, prompts[:2], 0))
    write_jsonl(regen / "test.jsonl", _regenerated(tokenizer, prompts[2:], 0))
    pack_label_set(str(regen), ["train.jsonl", "test.jsonl"], str(tmp_path / "packed"))
    groups = {row["id"]: row["prompt_group"] for stem in ("train", "test")
              for row in read_packed(str(tmp_path / "packed" / f"{stem}.jsonl.gz"))}
    assert groups == {"a": "a", "b": "b", "c": "a"}  # the twin across files shares the group of its smallest id
