"""A client's request as SGLang's tokenizer process sees it, in-process: built, normalised and validated through the
plugin's applied hooks (``sglang_patches/client_predictions.py``)."""

from types import SimpleNamespace

from sglang_patches import client_predictions

CONTEXT_LEN = 512  # the tokenizer manager's context_len in these tests (the tiny targets')


def generate_input(sampling_params, labels=None, text="hello", rid=None):
    """A ``GenerateReqInput`` as SGLang's HTTP server builds it, normalised through the applied hook, each of its
    requests then validated as ``TokenizerManager._validate_one_request`` does after SGLang's own checks."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    obj = GenerateReqInput(text=text, sampling_params=sampling_params, custom_labels=labels, rid=rid)
    obj.normalize_batch_and_arguments()
    tokenizer_manager = SimpleNamespace(context_len=CONTEXT_LEN)
    for item in [obj] if obj.is_single else [obj[index] for index in range(obj.batch_size)]:
        client_predictions.validate_one_request_after(None, tokenizer_manager, item, [])
    return obj
