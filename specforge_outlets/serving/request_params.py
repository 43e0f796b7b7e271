"""The ``custom_params`` keys of a request that ends at its recorded length, one spelling for every side.

The benchmark client sets them (``loadgen/end_at_length.py``: ``end_at_params``), the plugin
carries them through sglang-router in ``custom_labels`` (``sglang_patches/client_predictions.py``),
and the server's logit processor reads them (``EndAtOutputLength``). Here, apart from all three,
so that the plugin imports nothing of the benchmarks.
"""

OUTPUT_LEN_PARAM = "outlets_end_at_output_len"
STOP_TOKEN_PARAM = "outlets_end_token_id"
