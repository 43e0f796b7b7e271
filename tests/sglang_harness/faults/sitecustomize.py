"""Test-only fault injection into a real server's predictor (tests/test_sglang_predictor.py).

The harness puts this directory on a server's ``PYTHONPATH`` only when a test asks for a fault
(``SGLangServer(..., fail_prompt=[...])``); Python imports ``sitecustomize`` in every process at
start-up. The OUTLETS draft then raises for prompts that begin with the ids in
``OUTLETS_HARNESS_FAIL_PROMPT``, so the test sees the plugin's fallback on a real server without a
fault switch in the plugin itself.
"""

import os

_FAIL_PROMPT = os.environ.get("OUTLETS_HARNESS_FAIL_PROMPT")

if _FAIL_PROMPT:
    from specforge_outlets.model.plain_draft import OutletsLengthPredictor

    _prefix = [int(token) for token in _FAIL_PROMPT.split(",")]
    _predict = OutletsLengthPredictor.prompt_log_remaining

    def _failing_predict(self, fused_features, prompt_ids, first_token):
        if list(prompt_ids[:len(_prefix)]) == _prefix:
            raise RuntimeError("injected failure (test harness)")
        return _predict(self, fused_features, prompt_ids, first_token)

    OutletsLengthPredictor.prompt_log_remaining = _failing_predict
