"""A tiny randomly initialised Llama with a ChatML tokenizer, built locally (nothing touches the network).

A target whose forward costs next to nothing, so that what a check measures is the pipeline or the
server around the model: the tests' chat target (data pipeline, training, real SGLang servers) and
the benchmarks that drive real CPU servers (``benchmarks/scheduler_server_check.py``). It lives in the
package, not in ``tests/``, because benchmarks do not import the test suite.

The tokenizer mirrors SmolLM2's special tokens (0 <|endoftext|>, 1 <|im_start|>, 2 <|im_end|>).
"""

from __future__ import annotations

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
END_ID = 2
CORPUS = [
    "What is the capital of France? Paris is the capital of France.",
    "Write a Python function that adds two numbers: def add(a, b): return a + b",
    "List three colours: red, green and blue. Explain how the water cycle works.",
    "user assistant system hello world the quick brown fox jumps over the lazy dog 0123456789",
]


def make_chat_tokenizer(eos_token: str = "<|im_end|>"):
    """A small byte-level BPE tokenizer with ChatML specials and template (~300 tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    backend.train_from_iterator(CORPUS * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=eos_token, pad_token="<|endoftext|>", bos_token="<|im_start|>"
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def make_chat_target(directory: str, end_bias: float = 0.0, layers: int = 6) -> str:
    """A tiny random Llama with the chat tokenizer, saved to ``directory``.

    ``end_bias`` raises the end-of-turn logit (a generation-config ``sequence_bias``) so that
    sampled turns end after a few tokens and both finish reasons occur.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = make_chat_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=END_ID, pad_token_id=0,
    )
    model = LlamaForCausalLM(config).eval()
    generation = {"bos_token_id": 1, "eos_token_id": END_ID, "pad_token_id": 0}
    if end_bias:
        generation["sequence_bias"] = [[[END_ID], end_bias]]
    model.generation_config = GenerationConfig(**generation)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory
