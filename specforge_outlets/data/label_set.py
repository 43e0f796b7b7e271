"""A regenerated label set packed for committing: responses without the prompts they answer.

Regenerating thousands of responses takes hours on a CPU; capture, training and evaluation must
rerun on any machine without that. The packed form keeps, per conversation, what the target
produced (response token ids, finish reasons, lengths) and a checksum of each prompt, but no
prompt text: the prompts stay where they came from (``../shared``), and unpacking joins the two,
refusing a label file whose responses do not answer the prompts it names.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import zlib
from typing import Any, Dict, Iterable, List, Sequence

from specforge_outlets.data.conversations import user_questions
from specforge_outlets.data.jsonl import iter_jsonl, recover_jsonl, write_jsonl
from specforge_outlets.errors import OutletsError

PACKED_SUFFIX = ".jsonl.gz"
SUMMARY = "summary.json"
# Fields of an assistant turn that are kept; the content is decoded again from token_ids.
TURN_FIELDS = ("num_tokens", "finish_reason", "token_ids")


def prompt_checksum(questions: Sequence[str]) -> int:
    """CRC-32 of a conversation's user turns, in order."""
    return zlib.crc32("\x1e".join(questions).encode("utf-8"))


def sample_noise_prompts(test_path: str, output: str, count: int, seed: int = 0) -> None:
    """A fixed, seeded subset of ``count`` test prompts (input order kept), for repeated sampling."""
    rows = [row for _, row in iter_jsonl(test_path)]
    if count > len(rows):
        raise OutletsError(f"--noise-prompts {count}: the test split has only {len(rows)} prompts")
    chosen = set(random.Random(seed).sample(range(len(rows)), count))
    write_jsonl(output, [row for index, row in enumerate(rows) if index in chosen])


def _pack_row(row: Dict[str, Any]) -> Dict[str, Any]:
    turns = [turn for turn in row["conversations"] if turn["role"] == "assistant"]
    missing = [i for i, turn in enumerate(turns) if "token_ids" not in turn]
    if missing:
        raise OutletsError(
            f"row {row['id']}: assistant turn {missing[0] + 1} has no token_ids; regenerate with "
            "--backend llama or hf (they record the generated ids)"
        )
    packed = {"id": row["id"], "prompt_crc32": prompt_checksum(user_questions(row["conversations"])),
              "turns": [{key: turn[key] for key in TURN_FIELDS} for turn in turns]}  # fmt: skip
    if "filtered" in row:
        packed["filtered"] = row["filtered"]
    return packed


def pack_label_set(regen_dir: str, names: Iterable[str], packed_dir: str) -> None:
    """``<regen_dir>/<name>`` (+ its ``.filtered.jsonl`` rows) -> ``<packed_dir>/<stem>.jsonl.gz``."""
    os.makedirs(packed_dir, exist_ok=True)
    summaries = {}
    for name in names:
        stem = name[: -len(".jsonl")]
        rows = recover_jsonl(os.path.join(regen_dir, name)) + recover_jsonl(
            os.path.join(regen_dir, f"{stem}.filtered.jsonl")
        )
        rows.sort(key=lambda row: str(row["id"]))
        tmp = os.path.join(packed_dir, f".{stem}{PACKED_SUFFIX}.tmp")
        text = "".join(json.dumps(_pack_row(row), separators=(",", ":")) + "\n" for row in rows)
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as handle:
            handle.write(text.encode("utf-8"))  # mtime 0: an unchanged file packs to the same bytes
        os.replace(tmp, os.path.join(packed_dir, f"{stem}{PACKED_SUFFIX}"))
        summary_path = os.path.join(regen_dir, f"{stem}.summary.json")
        if os.path.exists(summary_path):  # `outlets regenerate` finished this file
            with open(summary_path, encoding="utf-8") as handle:
                summaries[stem] = {**json.load(handle), "complete": True}
        else:  # still being regenerated: packed as far as it got, resumed after unpacking
            summaries[stem] = {"complete": False}
        summaries[stem]["packed_rows"] = len(rows)
    with open(os.path.join(packed_dir, SUMMARY), "w", encoding="utf-8") as handle:
        json.dump(summaries, handle, indent=2)


def read_packed(path: str) -> List[Dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def unpack_label_set(packed_dir: str, data_dir: str, regen_dir: str, target: str) -> None:
    """Rebuild ``<regen_dir>/<stem>.jsonl`` (and ``.filtered.jsonl``) from the packed responses.

    Each packed file answers the prompts of ``<data_dir>/<split>.jsonl`` (``noise-seed*`` answer
    ``noise.jsonl``); a packed id that is missing there, or whose prompt checksum differs, is
    refused with that id before anything is written. A file packed before its regeneration
    finished gets no summary, so ``outlets regenerate --resume`` continues it.
    """
    from transformers import AutoTokenizer

    from specforge_outlets.data.targets import resolve_target, stop_token_ids

    with open(os.path.join(packed_dir, SUMMARY), encoding="utf-8") as handle:
        summaries = json.load(handle)
    tokenizer = AutoTokenizer.from_pretrained(resolve_target(target))
    stop_ids = set(stop_token_ids(tokenizer))
    unpacked = {stem: _unpack_file(packed_dir, stem, data_dir, tokenizer, stop_ids) for stem in summaries}
    os.makedirs(regen_dir, exist_ok=True)  # written only once every file matched its prompts
    for stem, (kept, filtered) in unpacked.items():
        write_jsonl(os.path.join(regen_dir, f"{stem}.jsonl"), kept)
        write_jsonl(os.path.join(regen_dir, f"{stem}.filtered.jsonl"), filtered)
        if summaries[stem].get("complete", True):  # a partial file gets no summary: --resume completes it
            with open(os.path.join(regen_dir, f"{stem}.summary.json"), "w", encoding="utf-8") as handle:
                json.dump({**summaries[stem], "unpacked_from": packed_dir}, handle, indent=2)


def _unpack_file(packed_dir: str, stem: str, data_dir: str, tokenizer: Any, stop_ids: set) -> tuple:
    source = os.path.join(data_dir, "noise.jsonl" if stem.startswith("noise") else f"{stem}.jsonl")
    prompts = {row["id"]: row for _, row in iter_jsonl(source)}
    kept, filtered = [], []
    for packed in read_packed(os.path.join(packed_dir, f"{stem}{PACKED_SUFFIX}")):
        row = prompts.get(packed["id"])
        if row is None or prompt_checksum(user_questions(row["conversations"])) != packed["prompt_crc32"]:
            why = "is not in" if row is None else "has a different prompt in"
            raise OutletsError(
                f"{packed_dir}/{stem}{PACKED_SUFFIX}: id {packed['id']} {why} {source}; "
                "the label set answers other prompts (prepare them with the benchmark's settings)"
            )
        conversation = _conversation(row, packed["turns"], tokenizer, stop_ids)
        if "filtered" in packed:
            filtered.append({**conversation, "filtered": packed["filtered"]})
        else:
            kept.append(conversation)
    return kept, filtered


def _conversation(row: Dict[str, Any], turns: List[Dict[str, Any]], tokenizer: Any, stop_ids: set) -> Dict[str, Any]:
    history = [dict(row["conversations"][0])] if row["conversations"][0]["role"] == "system" else []
    for question, turn in zip(user_questions(row["conversations"]), turns):
        ids = turn["token_ids"]
        text_ids = ids[:-1] if ids and ids[-1] in stop_ids else ids
        content = tokenizer.decode(text_ids, skip_special_tokens=True)
        history += [{"role": "user", "content": question}, {"role": "assistant", "content": content, **turn}]
    return {"id": row["id"], "conversations": history}
