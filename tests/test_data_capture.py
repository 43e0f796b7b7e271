"""`outlets capture`: loss-mask spans through the chat template, labels, features and the post-pass."""

import json
import os

import pytest
import torch

from specforge_outlets.data import capture_command
from specforge_outlets.data.chat_tokens import tokenise_conversation
from specforge_outlets.data.conversations import RowError
from specforge_outlets.data.features import FeatureFileError, load_features, save_features
from specforge_outlets.data.labels import NO_LABEL
from specforge_outlets.errors import OutletsError
from specforge_outlets.model.tiny_chat_target import END_ID, make_chat_target, make_chat_tokenizer
from tests.data_fixtures import run_command, write_jsonl


def user(text):
    return {"role": "user", "content": text}


def answer(text, finish="stop"):
    return {"role": "assistant", "content": text, "num_tokens": 99, "finish_reason": finish}


@pytest.fixture(scope="module")
def tokenizer():
    return make_chat_tokenizer()


def masked_text(tokenizer, tokens):
    return [tokenizer.decode([i for i, m in zip(tokens.input_ids, tokens.loss_mask) if m])]


def test_loss_mask_covers_content_and_end_of_turn(tokenizer):
    conversation = [{"role": "system", "content": "Be brief."}, user("What is the capital?"), answer("Paris."),
                    user("And of Italy?"), answer("Rome, the capital of Italy.")]
    tokens = tokenise_conversation(tokenizer, conversation, END_ID)
    assert tokenizer.decode(tokens.input_ids) == tokenizer.apply_chat_template(
        [{"role": t["role"], "content": t["content"]} for t in conversation], tokenize=False)
    spans = [tokenizer.decode(tokens.input_ids[s:e]) for s, e in _spans(tokens.loss_mask)]
    assert spans == ["Paris.<|im_end|>", "Rome, the capital of Italy.<|im_end|>"]
    assert tokens.censored == [False, False]


def test_censored_turn_has_no_end_token_and_no_label(tokenizer):
    conversation = [user("Tell me a story."), answer("Once upon a time", finish="length"),
                    user("dropped: follows a censored turn"), answer("dropped")]
    tokens = tokenise_conversation(tokenizer, conversation, END_ID)
    assert tokens.censored == [True]
    assert tokenizer.decode(tokens.input_ids).endswith("<|im_start|>assistant\nOnce upon a time")
    assert [tokenizer.decode(tokens.input_ids[s:e]) for s, e in _spans(tokens.loss_mask)] == ["Once upon a time"]


def test_remaining_length_labels_on_hand_made_conversation(tokenizer, tmp_path):
    target = make_chat_target(str(tmp_path / "target"))
    rows = [{"id": "two-turns", "conversations": [user("Hi"), answer("Hello world"), user("Bye"),
                                                   answer("Cut here", finish="length")]}]
    out = tmp_path / "features"
    run_command(capture_command, ["capture", "--target", target, "--input", write_jsonl(tmp_path / "r.jsonl", rows),
                                  "--output", out, "--dtype", "float32"])
    features = load_features(str(out / "data_0.ckpt"), hidden_size=32)
    tokens = tokenise_conversation(tokenizer, rows[0]["conversations"], END_ID)
    (s1, e1), (s2, e2) = _spans(tokens.loss_mask)
    first = tokenizer("Hello world", add_special_tokens=False)["input_ids"]
    assert e1 - s1 == len(first) + 1  # content and <|im_end|>
    expected = [NO_LABEL] * len(tokens.input_ids)
    expected[s1:e1] = range(e1 - s1, 0, -1)  # L, L-1, ..., 1; the censored second turn stays unlabelled
    assert features["remaining_length"].tolist() == expected
    assert features["input_ids"].tolist() == tokens.input_ids
    assert features["loss_mask"].tolist() == tokens.loss_mask


def test_capture_command_writes_specforge_features(tmp_path):
    from transformers import AutoModelForCausalLM

    target = make_chat_target(str(tmp_path / "target"), layers=6)
    rows = [
        {"id": "a", "conversations": [user("What is 2+2?"), answer("4")]},
        {"id": "b", "conversations": [user("List colours"), answer("red green blue"), user("more"), answer("brown")]},
        {"id": "no-answer", "conversations": [user("unanswered")]},
        {"id": "long", "conversations": [user("word " * 60), answer("ok")]},
        {"id": "c", "conversations": [user("Story?"), answer("Once upon", finish="length")]},
    ]
    source = write_jsonl(tmp_path / "train.jsonl", rows)
    out = tmp_path / "features"
    assert run_command(capture_command, ["capture", "--target", target, "--input", source, "--output", out,
                                         "--max-length", 80]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["fusion_layers"] == [2, 3, 4] and manifest["specforge_layer_ids"] == [1, 2, 3]
    assert manifest["hidden_size"] == 32 and manifest["split"] == "train" and manifest["end_of_turn_token_id"] == END_ID
    assert [f["id"] for f in manifest["files"]] == ["a", "b", "c"]
    counts = manifest["counts"]
    assert (counts["written"], counts["skipped"]) == (3, 2)
    assert counts["skipped_too_long"] == 1 and counts["skipped_no_assistant_turn"] == 1
    assert counts["response_spans"] == 4 and counts["censored_spans"] == 1
    model = AutoModelForCausalLM.from_pretrained(target).eval()
    for entry in manifest["files"]:
        features = load_features(str(out / entry["file"]), hidden_size=32)
        assert features["hidden_state"].dtype == torch.bfloat16
        assert features["aux_hidden_state"].shape == (1, entry["tokens"], 96)
        with torch.no_grad():
            states = model(features["input_ids"][None], output_hidden_states=True).hidden_states
        torch.testing.assert_close(features["hidden_state"].float(), states[-1], atol=0.05, rtol=0.02)
        torch.testing.assert_close(features["aux_hidden_state"][..., 64:].float(), states[4], atol=0.05, rtol=0.02)
    assert int((load_features(str(out / "data_4.ckpt"))["remaining_length"] > 0).sum()) == 0  # censored only
    censored = load_features(str(out / "data_4.ckpt"))
    assert censored["remaining_lower_bound"].max() == int(censored["loss_mask"].sum())  # c - t, from c at t = 0
    with pytest.raises(Exception, match="already holds feature files"):
        run_command(capture_command, ["capture", "--target", target, "--input", source, "--output", out])


@pytest.mark.parametrize("line, message", [
    ({"id": "x1", "prompt": "hi"}, r"r.jsonl:2 \(id x1\): no 'conversations' list; .*outlets regenerate"),
    ("{oops", r"r.jsonl:2: .*fix or remove the line"),
    ({"id": "x1", "conversations": [answer("I speak first"), user("Hi"), answer("Hello")]},
     r"r.jsonl:2 \(id x1\): the conversation starts with an assistant turn, before any user turn; fix or remove"),
    ({"id": "x1", "conversations": [user("Hi"), {"role": "assistant"}]}, r"r.jsonl:2 \(id x1\): turn 1 is not a "),
])
def test_capture_refuses_a_row_it_cannot_read_before_writing_anything(tmp_path, line, message):
    target = make_chat_target(str(tmp_path / "target"))
    good = {"id": "a", "conversations": [user("What is 2+2?"), answer("4")]}
    source = write_jsonl(tmp_path / "r.jsonl", [good, line])
    out = tmp_path / "features"
    with pytest.raises(OutletsError, match=message):
        run_command(capture_command, ["capture", "--target", target, "--input", source, "--output", out])
    assert not out.exists()


def test_add_labels_to_specforge_captured_files(tmp_path):
    from specforge_outlets.data.add_labels import specforge_row_order

    target = make_chat_target(str(tmp_path / "target"))
    rows = [{"id": "a", "conversations": [user("Hi"), answer("Hello there")]},
            {"id": "b", "conversations": [user("Q"), answer("A one"), user("Q2"), answer("A two", finish="length")]},
            {"id": "c", "conversations": [user("Q"), answer("only one turn")]}]
    source = write_jsonl(tmp_path / "regen.jsonl", rows)
    ours = tmp_path / "ours"
    run_command(capture_command, ["capture", "--target", target, "--input", source, "--output", ours])
    # SpecForge's layout: rows_<a>-<b>/data_<i>.ckpt without labels, i after its seeded shuffle of the rows
    # (file 0 is row c, file 1 row b, file 2 row a); file 2 is from another conversation.
    assert specforge_row_order(3) == [2, 1, 0]
    theirs = tmp_path / "specforge" / "rows_0-5000"
    theirs.mkdir(parents=True)
    expected = {}
    for index, source_index in ((0, 2), (1, 1), (2, 1)):
        data = torch.load(ours / f"data_{source_index}.ckpt")
        expected[index] = data.pop("remaining_length")
        torch.save(data, theirs / f"data_{index}.ckpt")
    with pytest.raises(FeatureFileError, match="add-labels"):
        load_features(str(theirs / "data_0.ckpt"))
    run_command(capture_command, ["capture", "--add-labels", tmp_path / "specforge", "--input", source,
                                  "--specforge-batch-size", 1])
    for index in (0, 1):
        assert torch.equal(load_features(str(theirs / f"data_{index}.ckpt"))["remaining_length"], expected[index])
    summary = json.loads((tmp_path / "specforge" / "labels_summary.json").read_text())
    assert summary["labelled_files"] == 2 and summary["skipped_join_mismatch"] == 1
    assert "remaining_length" not in torch.load(theirs / "data_2.ckpt")


def test_add_labels_censors_a_span_cut_by_max_length(tmp_path):
    from specforge_outlets.data.add_labels import label_file

    path = str(tmp_path / "data_0.ckpt")
    mask = torch.tensor([0, 0, 1, 1, 0, 0, 1, 1, 1])
    torch.save({"input_ids": torch.arange(9), "loss_mask": mask, "hidden_state": torch.zeros(1, 9, 4),
                "aux_hidden_state": torch.zeros(1, 9, 12)}, path)
    row = {"conversations": [user("a"), answer("b"), user("c"), answer("d"), user("e"), answer("f")]}
    assert label_file(path, row, max_length=9)["censored_spans"] == 1
    assert load_features(path)["remaining_length"].tolist() == [-1, -1, 2, 1, -1, -1, -1, -1, -1]


def test_template_that_rewrites_history_is_reported(tokenizer):
    rewriting = make_chat_tokenizer()
    rewriting.chat_template = (  # drops earlier assistant turns, like reasoning-stripping templates
        "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}<|im_start|>{{ m['role'] }}\n"
        "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with pytest.raises(RowError, match="prefix-stable"):
        tokenise_conversation(rewriting, [user("a"), answer("b"), user("c"), answer("d")], END_ID)


def _spans(mask):
    spans, start = [], None
    for position, value in enumerate(list(mask) + [0]):
        if value and start is None:
            start = position
        elif not value and start is not None:
            spans.append((start, position))
            start = None
    return spans


def test_generated_ids_are_used_as_they_are(tokenizer):
    """With token_ids, each response is what the target generated, even where re-tokenising differs."""
    def generated(text, finish="stop"):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + ([END_ID] if finish == "stop" else [])
        return {**answer(text, finish=finish), "token_ids": ids}

    conversation = [{"role": "system", "content": "Be brief."}, user("What is the capital?"), generated("Paris."),
                    user("And of Italy?"), generated("Rome, the capital of Italy.")]
    by_ids = tokenise_conversation(tokenizer, conversation, END_ID)
    by_text = tokenise_conversation(tokenizer, [{k: v for k, v in t.items() if k != "token_ids"} for t in conversation],
                                    END_ID)
    # Same tokens where re-tokenising is stable (the text path also keeps the template's trailing newline).
    assert by_ids.input_ids == by_text.input_ids[: len(by_ids.input_ids)]
    assert by_ids.loss_mask == by_text.loss_mask[: len(by_ids.loss_mask)]
    # A response whose ids are not what its text re-tokenises to: the ids win, and so does their count.
    odd = [user("Hi"), {**generated("Hello world"), "token_ids": [7, 7, 7, END_ID]}]
    tokens = tokenise_conversation(tokenizer, odd, END_ID)
    assert [tokens.input_ids[s:e] for s, e in _spans(tokens.loss_mask)] == [[7, 7, 7, END_ID]]
    cut = tokenise_conversation(tokenizer, [user("Hi"), {**generated("a b c", finish="length")}], END_ID)
    assert cut.censored == [True] and cut.input_ids[-3:] == tokenizer("a b c", add_special_tokens=False)["input_ids"]
    with pytest.raises(RowError, match="do not end with"):
        tokenise_conversation(tokenizer, [user("Hi"), {**generated("x"), "token_ids": [7]}], END_ID)


def test_feature_subsets_are_nested_links_with_their_own_manifest(tmp_path):
    from specforge_outlets.data.feature_subset import subset_features

    source = tmp_path / "features"
    source.mkdir()
    entries = []
    for i in range(10):
        (source / f"data_{i}.ckpt").write_bytes(b"x")
        entries.append({"file": f"data_{i}.ckpt", "id": f"r{i}"})
    (source / "manifest.json").write_text(json.dumps({"input": "regen.jsonl", "files": entries}))
    small = subset_features(str(source), str(tmp_path / "s3"), 3)
    large = subset_features(str(source), str(tmp_path / "s6"), 6)
    names = lambda d: sorted(n for n in os.listdir(d) if n.endswith(".ckpt"))
    assert len(names(small)) == 3 and set(names(small)) <= set(names(large))
    manifest = json.loads((tmp_path / "s3" / "manifest.json").read_text())
    assert sorted(e["file"] for e in manifest["files"]) == names(small) and os.path.isabs(manifest["input"])
    assert all(os.path.islink(os.path.join(small, n)) for n in names(small))
    with pytest.raises(OutletsError, match="has 10 feature files"):
        subset_features(str(source), str(tmp_path / "s11"), 11)
    with pytest.raises(OutletsError, match="not empty"):
        subset_features(str(source), str(tmp_path / "s3"), 3)


def test_validation_split_holds_out_whole_prompt_groups(tmp_path):
    from specforge_outlets.data.feature_subset import split_validation
    from specforge_outlets.data.prompt_groups import check_split_groups

    source = tmp_path / "features"
    source.mkdir()
    rows, entries = [], []
    for i in range(40):
        prompt = f"Question number {i // 2} about topic {i // 2}, asked twice"  # every prompt has a twin
        rows.append({"id": f"r{i}", "conversations": [{"role": "user", "content": prompt},
                                                      {"role": "assistant", "content": "a"}]})
        (source / f"data_{i}.ckpt").write_bytes(b"x")
        entries.append({"file": f"data_{i}.ckpt", "id": f"r{i}"})
    write_jsonl(tmp_path / "regen.jsonl", rows)
    (source / "manifest.json").write_text(json.dumps({"input": str(tmp_path / "regen.jsonl"), "files": entries}))
    train, validation = split_validation(str(source), str(tmp_path / "fit"), str(tmp_path / "val"), 0.25)
    ids = {part: [e["id"] for e in json.loads((tmp_path / part / "manifest.json").read_text())["files"]]
           for part in ("fit", "val")}
    assert len(ids["val"]) == 10 and len(ids["fit"]) == 30  # 5 of the 20 twin pairs
    by_id = {row["id"]: row["conversations"][0]["content"] for row in rows}
    check_split_groups({part: [(i, by_id[i]) for i in values] for part, values in ids.items()})  # no pair split
    (source / "manifest.json").write_text(json.dumps({"input": str(tmp_path / "gone.jsonl"), "files": entries}))
    with pytest.raises(OutletsError, match="needs the prompts"):
        split_validation(str(source), str(tmp_path / "fit2"), str(tmp_path / "val2"), 0.25)


def test_the_manifest_has_one_atomic_writer_and_one_reader_that_names_a_bad_file(tmp_path):
    from specforge_outlets.data.manifest import read_manifest, write_manifest
    from specforge_outlets.errors import OutletsError

    assert read_manifest(str(tmp_path)) == {}  # features written by another tool
    write_manifest(str(tmp_path), {"fusion_layers": [1, 2, 3], "files": []})
    assert read_manifest(str(tmp_path)) == {"fusion_layers": [1, 2, 3], "files": []}
    assert os.listdir(tmp_path) == ["manifest.json"]  # no temporary file left
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(OutletsError, match=r"manifest\.json: not readable JSON .*re-run `outlets capture`"):
        read_manifest(str(tmp_path))


def test_capture_in_shards_then_resume_gives_the_same_files_and_manifest(tmp_path):
    target = make_chat_target(str(tmp_path / "target"))
    rows = [{"id": f"r{i}", "conversations": [user(f"Question {i}?"), answer("words " * (i + 1))]} for i in range(5)]
    source = write_jsonl(tmp_path / "r.jsonl", rows)
    whole, sharded = tmp_path / "whole", tmp_path / "sharded"
    base = ["capture", "--target", target, "--input", source, "--dtype", "float32"]
    assert run_command(capture_command, [*base, "--output", whole]) == 0
    for shard in ("0/2", "1/2"):
        assert run_command(capture_command, [*base, "--output", sharded, "--shard", shard, "--resume"]) == 0
    assert not (sharded / "manifest.json").exists()  # a shard does not finish the directory
    assert run_command(capture_command, [*base, "--output", sharded, "--resume"]) == 0
    manifests = [json.loads((d / "manifest.json").read_text()) for d in (whole, sharded)]
    assert manifests[0]["files"] == manifests[1]["files"] and manifests[1]["counts"]["resumed"] == 5
    for entry in manifests[0]["files"]:
        a, b = (load_features(str(d / entry["file"])) for d in (whole, sharded))
        assert all(torch.equal(a[key], b[key]) for key in a)
    other = write_jsonl(tmp_path / "other.jsonl", rows[::-1])
    with pytest.raises(OutletsError, match="holds another conversation than row r4"):
        run_command(capture_command, [*base[:-4], "--input", other, "--dtype", "float32", "--output", sharded, "--resume"])


def test_an_interrupted_new_capture_leaves_no_output_and_resume_finishes_it(tmp_path, monkeypatch):
    target = make_chat_target(str(tmp_path / "target"))
    rows = [{"id": f"r{i}", "conversations": [user(f"Question {i}?"), answer("words " * (i + 1))]} for i in range(3)]
    source = write_jsonl(tmp_path / "r.jsonl", rows)
    out = tmp_path / "features"
    args = ["capture", "--target", target, "--input", source, "--output", out]
    saved = []

    def stopped_after_one(path, features):
        if saved:
            raise KeyboardInterrupt
        saved.append(path)
        save_features(path, features)

    monkeypatch.setattr(capture_command, "save_features", stopped_after_one)
    with pytest.raises(KeyboardInterrupt):
        run_command(capture_command, args)
    assert not out.exists()  # never a directory of feature files without its manifest
    monkeypatch.undo()
    assert run_command(capture_command, [*args, "--resume"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert [f["id"] for f in manifest["files"]] == ["r0", "r1", "r2"] and manifest["counts"]["resumed"] == 1
    assert not (tmp_path / "features.partial").exists()


def test_shards_of_one_directory_start_independently(tmp_path):
    target = make_chat_target(str(tmp_path / "target"))
    rows = [{"id": f"r{i}", "conversations": [user(f"Question {i}?"), answer("words " * (i + 1))]} for i in range(4)]
    source = write_jsonl(tmp_path / "r.jsonl", rows)
    out = tmp_path / "sharded"
    base = ["capture", "--target", target, "--input", source, "--output", out]
    for shard in ("0/2", "1/2"):  # no --resume: the second shard does not see the first's files as its own
        assert run_command(capture_command, [*base, "--shard", shard]) == 0
    assert sorted(os.listdir(out)) == [f"data_{i}.ckpt" for i in range(4)]
    with pytest.raises(OutletsError, match="already holds feature files of shard 1/2"):
        run_command(capture_command, [*base, "--shard", "1/2"])
    assert run_command(capture_command, [*base, "--resume"]) == 0
    assert json.loads((out / "manifest.json").read_text())["counts"]["resumed"] == 4
