"""A client's per-request settings in ``custom_labels`` (sglang_patches/client_predictions.py) on SGLang 0.5.23's
own request objects, in-process: the field sglang-router keeps on ``/generate`` reaches ``custom_params``, and a
prediction that is not a positive number within the context length, or an ``outlets_*`` key the plugin does not read,
is refused naming the request. On a real server:
tests/test_sglang_server.py."""

from __future__ import annotations

import pytest

pytest.importorskip("sglang", reason="SGLang tests run in the serve environment (make test)")

from sglang_patches import client_predictions, state  # noqa: E402
from sglang_patches.settings import CUSTOM_PARAM_KEY, QUANTILES_PARAM_KEY  # noqa: E402
from specforge_outlets.serving.request_params import OUTPUT_LEN_PARAM, STOP_TOKEN_PARAM  # noqa: E402
from tests.sglang_harness.fixtures import plugins_loaded  # noqa: F401  (fixtures)
from tests.sglang_harness.request_input import CONTEXT_LEN, generate_input  # noqa: E402


def prediction_of(sampling_params: dict):
    """The prediction the scheduler reads from SGLang's ``SamplingParams`` built from the request's dict."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    return client_predictions.external_prediction(SamplingParams(**sampling_params))


def test_a_label_becomes_the_prediction(plugins_loaded, monkeypatch):
    monkeypatch.setattr(state, "plugin_active", lambda: True)
    obj = generate_input({"max_new_tokens": 3}, {CUSTOM_PARAM_KEY: "120", "team": "a"})
    assert obj.sampling_params["max_new_tokens"] == 3
    assert prediction_of(obj.sampling_params) == 120.0
    # out of the labels (SGLang's metrics refuse unknown label names); the client's own labels stay
    assert obj.custom_labels == {"team": "a"}
    assert generate_input({}, {CUSTOM_PARAM_KEY: "7"}).custom_labels is None
    assert prediction_of(generate_input(None, {CUSTOM_PARAM_KEY: "7"}).sampling_params) == 7.0


def test_custom_params_win_and_other_custom_params_are_kept(plugins_loaded, monkeypatch):
    monkeypatch.setattr(state, "plugin_active", lambda: True)
    obj = generate_input({"custom_params": {CUSTOM_PARAM_KEY: 30, "other": 1}}, {CUSTOM_PARAM_KEY: "999"})
    assert prediction_of(obj.sampling_params) == 30.0
    obj = generate_input({"custom_params": {"other": 1}}, {CUSTOM_PARAM_KEY: "55"})
    assert obj.sampling_params["custom_params"] == {"other": 1, CUSTOM_PARAM_KEY: "55"}


def test_a_batch_gets_the_label_where_an_item_has_no_prediction(plugins_loaded, monkeypatch):
    monkeypatch.setattr(state, "plugin_active", lambda: True)
    obj = generate_input([{"custom_params": {CUSTOM_PARAM_KEY: 4}}, {}], {CUSTOM_PARAM_KEY: "80"}, text=["a", "b"])
    assert [prediction_of(params) for params in obj.sampling_params] == [4.0, 80.0]


def test_the_end_at_length_settings_travel_as_labels_and_arrive_as_integers(plugins_loaded, monkeypatch):
    """What `outlets bench-serving --through-router` sends; the logit processor compares them with token counts."""
    monkeypatch.setattr(state, "plugin_active", lambda: True)
    obj = generate_input({"max_new_tokens": 8}, {CUSTOM_PARAM_KEY: "3.0", OUTPUT_LEN_PARAM: "3", STOP_TOKEN_PARAM: "2"})
    assert obj.sampling_params["custom_params"] == {CUSTOM_PARAM_KEY: "3.0", OUTPUT_LEN_PARAM: 3, STOP_TOKEN_PARAM: 2}
    assert obj.custom_labels is None
    with pytest.raises(ValueError, match=f"custom_labels\\['{OUTPUT_LEN_PARAM}'\\] = 'three' is not an integer"):
        generate_input({}, {OUTPUT_LEN_PARAM: "three", STOP_TOKEN_PARAM: "2"})


@pytest.mark.parametrize("value", ["lots", "0", "-3", "nan", "inf"])
def test_a_prediction_that_is_not_a_positive_number_is_refused_naming_the_request(plugins_loaded, monkeypatch, value):
    monkeypatch.setattr(state, "plugin_active", lambda: True)
    with pytest.raises(ValueError, match=f"request req-7: {CUSTOM_PARAM_KEY} = '{value}' is not a positive number"):
        generate_input({}, {CUSTOM_PARAM_KEY: value}, rid="req-7")  # through the router
    with pytest.raises(ValueError, match="request req-8: .* is not a positive number"):
        generate_input({"custom_params": {CUSTOM_PARAM_KEY: value}}, None, rid="req-8")  # straight to the server
    with pytest.raises(ValueError, match="request b: .* is not a positive number"):
        generate_input([{}, {"custom_params": {CUSTOM_PARAM_KEY: value}}], None, text=["x", "y"], rid=["a", "b"])
    for flag in (True, False):
        with pytest.raises(ValueError, match="is not a positive number"):
            generate_input({"custom_params": {CUSTOM_PARAM_KEY: flag}}, None)
    assert prediction_of(generate_input({"custom_params": {CUSTOM_PARAM_KEY: 0.5}}, None).sampling_params) == 0.5


@pytest.mark.parametrize("value", [1e12, "1e12", CONTEXT_LEN + 1, "513"])
def test_a_prediction_above_the_context_length_is_refused_naming_the_value_and_the_limit(plugins_loaded, monkeypatch,
                                                                                        value):
    """1e12 tokens cannot be generated: taken as a prediction it would poison the order, the KV admission and the
    error metrics. Refused, from custom_params and from custom_labels (the router's way)."""
    monkeypatch.setattr(state, "plugin_active", lambda: True)
    refusal = (f"request huge: {CUSTOM_PARAM_KEY} = {value!r} is above the model's context length "
               f"({CONTEXT_LEN} tokens)")
    with pytest.raises(ValueError) as refused:
        generate_input({"custom_params": {CUSTOM_PARAM_KEY: value}}, None, rid="huge")
    assert str(refused.value).startswith(refusal), refused.value
    with pytest.raises(ValueError, match=r"request huge: .* is above the model's context length \(512 tokens\)"):
        generate_input({}, {CUSTOM_PARAM_KEY: str(value)}, rid="huge")
    assert prediction_of(generate_input({"custom_params": {CUSTOM_PARAM_KEY: CONTEXT_LEN}}, None).sampling_params) == 512


def test_quantiles_above_the_context_length_are_refused(plugins_loaded, monkeypatch):
    monkeypatch.setattr(state, "plugin_active", lambda: True)
    with pytest.raises(ValueError, match=f"request q: {QUANTILES_PARAM_KEY} = .* is not usable \\(1e\\+06 tokens is "
                                         "above the model's context length \\(512 tokens\\)\\)"):
        generate_input({"custom_params": {QUANTILES_PARAM_KEY: [10, 20, 30, 40, 1e6]}}, None, rid="q")
    generate_input({"custom_params": {QUANTILES_PARAM_KEY: [10, 20, 30, 40, CONTEXT_LEN]}}, None)


def test_a_misspelt_outlets_parameter_is_refused_naming_it_and_the_valid_ones(plugins_loaded, monkeypatch):
    """``outlets_predicted_len`` for ``outlets_predicted_output_len`` was ignored: the request ran on the prior."""
    monkeypatch.setattr(state, "plugin_active", lambda: True)
    valid = ("the plugin reads outlets_predicted_output_len, outlets_predicted_quantiles, outlets_end_at_output_len, "
             "outlets_end_token_id")
    with pytest.raises(ValueError) as refused:
        generate_input({"custom_params": {"outlets_predicted_len": 100, "other": 1}}, None, rid="typo")
    assert str(refused.value) == f"request typo: unknown OUTLETS parameter custom_params['outlets_predicted_len']; {valid}"
    with pytest.raises(ValueError) as refused:  # through the router: a label the plugin does not move
        generate_input({}, {"outlets_predicted_output_length": "100", "team": "a"}, rid="typo")
    assert str(refused.value) == (f"request typo: unknown OUTLETS parameter "
                                  f"custom_labels['outlets_predicted_output_length']; {valid}")
    with pytest.raises(ValueError, match="request b: unknown OUTLETS parameter custom_params\\['outlets_x'\\]"):
        generate_input([{}, {"custom_params": {"outlets_x": 1}}], None, text=["x", "y"], rid=["a", "b"])
    generate_input({"custom_params": {"other": 1}}, {"team": "a"})  # a client's own keys are its business


def test_without_an_outlets_policy_labels_move_but_nothing_is_refused(plugins_loaded, monkeypatch):
    """A baseline server behind the same router must end requests where the benchmark says; it reads no prediction."""
    monkeypatch.setattr(state, "plugin_active", lambda: False)
    obj = generate_input({"max_new_tokens": 3}, {CUSTOM_PARAM_KEY: "120", OUTPUT_LEN_PARAM: "4", "team": "a"})
    assert obj.sampling_params["custom_params"] == {CUSTOM_PARAM_KEY: "120", OUTPUT_LEN_PARAM: 4}
    assert obj.custom_labels == {"team": "a"}
    for custom in ({CUSTOM_PARAM_KEY: -1}, {CUSTOM_PARAM_KEY: 1e12}, {"outlets_typo": 1}):
        generate_input({"custom_params": custom}, None)  # not read, so not refused
    assert generate_input({"max_new_tokens": 3}, {"team": "a"}).custom_labels == {"team": "a"}
