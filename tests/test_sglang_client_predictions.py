"""A client's per-request settings in ``custom_labels`` (sglang_patches/client_predictions.py) on SGLang 0.5.23's
own request objects, in-process: the field sglang-router keeps on ``/generate`` reaches ``custom_params``, and a
prediction that is not a positive number is refused naming the request. On a real server:
tests/test_sglang_server.py."""

from __future__ import annotations

import pytest

pytest.importorskip("sglang", reason="SGLang tests run in the serve environment (make test)")

from sglang_patches import client_predictions, state  # noqa: E402
from sglang_patches.settings import CUSTOM_PARAM_KEY  # noqa: E402
from specforge_outlets.serving.request_params import OUTPUT_LEN_PARAM, STOP_TOKEN_PARAM  # noqa: E402
from tests.sglang_harness.fixtures import plugins_loaded  # noqa: F401  (fixtures)


def generate_input(sampling_params, labels, text="hello", rid=None):
    """A ``GenerateReqInput`` as SGLang's HTTP server builds it, normalised through the applied hook."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    obj = GenerateReqInput(text=text, sampling_params=sampling_params, custom_labels=labels, rid=rid)
    obj.normalize_batch_and_arguments()
    return obj


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


def test_without_an_outlets_policy_labels_move_but_nothing_is_refused(plugins_loaded, monkeypatch):
    """A baseline server behind the same router must end requests where the benchmark says; it reads no prediction."""
    monkeypatch.setattr(state, "plugin_active", lambda: False)
    obj = generate_input({"max_new_tokens": 3}, {CUSTOM_PARAM_KEY: "120", OUTPUT_LEN_PARAM: "4", "team": "a"})
    assert obj.sampling_params["custom_params"] == {CUSTOM_PARAM_KEY: "120", OUTPUT_LEN_PARAM: 4}
    assert obj.custom_labels == {"team": "a"}
    generate_input({"custom_params": {CUSTOM_PARAM_KEY: -1}}, None)  # not read, so not refused
    assert generate_input({"max_new_tokens": 3}, {"team": "a"}).custom_labels == {"team": "a"}
