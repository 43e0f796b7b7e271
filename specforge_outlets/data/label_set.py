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
import zlib
from typing import Any, Dict, Iterable, List, Sequence

from specforge_outlets.data.conversations import user_questions
from specforge_outlets.data.jsonl import iter_jsonl, recover_jsonl, write_jsonl
from specforge_outlets.errors import OutletsError

PACKED_SUFFIX = ".jsonl.gz"
SUMMARY = "summary.json"
# Packed files sampled with the main seed: a response in either answers its prompt in whichever split.
MAIN_SEED_STEMS = ("train", "test")
# Fields of an assistant turn that are kept; the content is decoded again from token_ids.
TURN_FIELDS = ("num_tokens", "finish_reason", "token_ids")


def prompt_checksum(questions: Sequence[str]) -> int:
    """CRC-32 of a conversation's user turns, in order."""
    return zlib.crc32("\x1e".join(questions).encode("utf-8"))


def seeded_id_order(row_id: str, seed: int = 0) -> int:
    """A row's place in a seeded order of ids that does not depend on the file's order: taking the
    first n of it gives nested subsets (a larger n holds a smaller one's rows)."""
    return zlib.crc32(f"{seed}:{row_id}".encode())


def sample_noise_prompts(test_path: str, output: str, count: int, seed: int = 0, keep: Iterable[str] = ()) -> None:
    """``count`` test prompts (input order kept) for repeated sampling, the ``keep`` ids among them.

    ``keep`` names prompts that already have repeated samples; the rest are the test prompts first
    in a seeded order of ids, so growing ``count`` or re-splitting keeps the earlier choice.
    """
    rows = [row for _, row in iter_jsonl(test_path)]
    if count > len(rows):
        raise OutletsError(f"--noise-prompts {count}: the test split has only {len(rows)} prompts")
    kept = set(keep)
    order = sorted(rows, key=lambda row: (row["id"] not in kept, seeded_id_order(row["id"], seed)))
    chosen = {row["id"] for row in order[:count]}
    write_jsonl(output, [row for row in rows if row["id"] in chosen])


def _pack_row(row: Dict[str, Any], group: str) -> Dict[str, Any]:
    turns = [turn for turn in row["conversations"] if turn["role"] == "assistant"]
    missing = [i for i, turn in enumerate(turns) if "token_ids" not in turn]
    if missing:
        raise OutletsError(
            f"row {row['id']}: assistant turn {missing[0] + 1} has no token_ids; regenerate with "
            "--backend llama or hf (they record the generated ids)"
        )
    packed = {"id": row["id"], "prompt_crc32": prompt_checksum(user_questions(row["conversations"])),
              "prompt_group": group, "turns": [{key: turn[key] for key in TURN_FIELDS} for turn in turns]}  # fmt: skip
    if "filtered" in row:
        packed["filtered"] = row["filtered"]
    return packed


def pack_label_set(regen_dir: str, names: Iterable[str], packed_dir: str) -> None:
    """``<regen_dir>/<name>`` (+ its ``.filtered.jsonl`` rows) -> ``<packed_dir>/<stem>.jsonl.gz``.

    Each row records its prompt group (``data/prompt_groups.py``, over the rows of every file, named
    by the group's smallest id), so that the committed set can be checked for twins across the
    split without the prompt text.
    """
    from specforge_outlets.data.prepare_command import prompt_text
    from specforge_outlets.data.prompt_groups import prompt_groups

    os.makedirs(packed_dir, exist_ok=True)
    files = {}
    for name in names:
        stem = name[: -len(".jsonl")]
        rows = recover_jsonl(os.path.join(regen_dir, name)) + recover_jsonl(
            os.path.join(regen_dir, f"{stem}.filtered.jsonl")
        )
        files[stem] = sorted(rows, key=lambda row: str(row["id"]))
    prompts = {str(row["id"]): prompt_text(row) for rows in files.values() for row in rows}
    ids = sorted(prompts)
    roots = prompt_groups([prompts[row_id] for row_id in ids])
    group_of = {row_id: ids[root] for row_id, root in zip(ids, roots)}
    summaries = {}
    for stem, rows in files.items():
        tmp = os.path.join(packed_dir, f".{stem}{PACKED_SUFFIX}.tmp")
        text = "".join(json.dumps(_pack_row(row, group_of[str(row["id"])]), separators=(",", ":")) + "\n"
                       for row in rows)
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as handle:
            handle.write(text.encode("utf-8"))  # mtime 0: an unchanged file packs to the same bytes
        os.replace(tmp, os.path.join(packed_dir, f"{stem}{PACKED_SUFFIX}"))
        summary_path = os.path.join(regen_dir, f"{stem}.summary.json")
        if os.path.exists(summary_path):  # `outlets regenerate` finished this file
            with open(summary_path, encoding="utf-8") as handle:
                summaries[stem] = {**_portable(json.load(handle)), "complete": True}
        else:  # still being regenerated: packed as far as it got, resumed after unpacking
            summaries[stem] = {"complete": False}
        summaries[stem]["packed_rows"] = len(rows)
    with open(os.path.join(packed_dir, SUMMARY), "w", encoding="utf-8") as handle:
        json.dump(summaries, handle, indent=2)


def _portable(summary: Dict[str, Any]) -> Dict[str, Any]:
    """A regeneration's summary as a committed label set keeps it: no path of the machine that made it.

    Its input and output keep their file names; where it was last unpacked from (a regeneration
    resumed from an unpacked set) is left out."""
    kept = {key: value for key, value in summary.items() if key != "unpacked_from"}
    for key in ("input", "output"):
        if isinstance(kept.get(key), str):
            kept[key] = os.path.basename(kept[key])
    return kept


def read_packed(path: str) -> List[Dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def unpack_label_set(packed_dir: str, data_dir: str, regen_dir: str, target: str) -> Dict[str, int]:
    """Rebuild ``<regen_dir>/<stem>.jsonl`` (and ``.filtered.jsonl``) from the packed responses.

    Every packed response must answer a prompt of ``<data_dir>/{train,test}.jsonl`` (same id, same
    prompt checksum); one that does not is refused with its id before anything is written. The
    ``train`` and ``test`` files were sampled with the same seed, so each of their responses goes
    to its prompt's split as ``data_dir`` has it now: a re-split (by prompt group) regenerates
    nothing already answered. ``noise-seed*`` files answer ``noise.jsonl`` and keep the samples of
    its prompts. A file gets a summary only if it answers every prompt of its split, so
    ``outlets regenerate --resume`` completes the others. Returns how many responses moved.
    """
    from transformers import AutoTokenizer

    from specforge_outlets.data.targets import resolve_target, stop_token_ids

    with open(os.path.join(packed_dir, SUMMARY), encoding="utf-8") as handle:
        summaries = json.load(handle)
    tokenizer = AutoTokenizer.from_pretrained(resolve_target(target))
    stop_ids = set(stop_token_ids(tokenizer))
    split_ids = {split: [row["id"] for _, row in iter_jsonl(os.path.join(data_dir, f"{split}.jsonl"))]
                 for split in MAIN_SEED_STEMS if os.path.exists(os.path.join(data_dir, f"{split}.jsonl"))}  # fmt: skip
    prompts = {row["id"]: row for split in split_ids for _, row in iter_jsonl(os.path.join(data_dir, f"{split}.jsonl"))}
    noise_path = os.path.join(data_dir, "noise.jsonl")
    split_ids["noise"] = [row["id"] for _, row in iter_jsonl(noise_path)] if os.path.exists(noise_path) else []
    answered = {stem: _unpack_file(packed_dir, stem, data_dir, prompts, tokenizer, stop_ids) for stem in summaries}
    main_pool = {row["id"]: row for stem in MAIN_SEED_STEMS for row in answered.get(stem, [])}
    moved: Dict[str, int] = {}
    outputs = {}
    for stem in summaries:
        split = stem if stem in MAIN_SEED_STEMS else "noise"
        pool = main_pool if split != "noise" else {row["id"]: row for row in answered[stem]}
        wanted = set(split_ids.get(split, []))
        rows = sorted((pool[i] for i in wanted if i in pool), key=lambda row: str(row["id"]))
        if split != "noise":
            arrived = {row["id"] for row in rows} - {row["id"] for row in answered.get(stem, [])}
            moved[f"responses moved into {stem}"] = len(arrived)
        else:
            moved[f"{stem} samples of prompts no longer in noise.jsonl"] = len(pool) - len(rows)
        outputs[stem] = (rows, len(rows) == len(wanted) and bool(wanted))
    os.makedirs(regen_dir, exist_ok=True)  # written only once every file matched its prompts
    for stem, (rows, complete) in outputs.items():
        write_jsonl(os.path.join(regen_dir, f"{stem}.jsonl"), [row for row in rows if "filtered" not in row])
        write_jsonl(os.path.join(regen_dir, f"{stem}.filtered.jsonl"), [row for row in rows if "filtered" in row])
        summary = os.path.join(regen_dir, f"{stem}.summary.json")
        if complete:  # an incomplete file gets no summary: --resume completes it
            with open(summary, "w", encoding="utf-8") as handle:
                json.dump({**summaries[stem], "unpacked_from": packed_dir}, handle, indent=2)
        elif os.path.exists(summary):
            os.remove(summary)
    return moved


def _unpack_file(packed_dir: str, stem: str, data_dir: str, prompts: Dict[str, Any], tokenizer: Any,
                 stop_ids: set) -> List[Dict[str, Any]]:
    rows = []
    for packed in read_packed(os.path.join(packed_dir, f"{stem}{PACKED_SUFFIX}")):
        row = prompts.get(packed["id"])
        if row is None or prompt_checksum(user_questions(row["conversations"])) != packed["prompt_crc32"]:
            why = "is not in" if row is None else "has a different prompt in"
            raise OutletsError(
                f"{packed_dir}/{stem}{PACKED_SUFFIX}: id {packed['id']} {why} {data_dir}/{{train,test}}.jsonl; "
                "the label set answers other prompts (prepare them with the benchmark's settings)"
            )
        conversation = _conversation(row, packed["turns"], tokenizer, stop_ids)
        rows.append({**conversation, "filtered": packed["filtered"]} if "filtered" in packed else conversation)
    return rows


def _conversation(row: Dict[str, Any], turns: List[Dict[str, Any]], tokenizer: Any, stop_ids: set) -> Dict[str, Any]:
    history = [dict(row["conversations"][0])] if row["conversations"][0]["role"] == "system" else []
    for question, turn in zip(user_questions(row["conversations"]), turns):
        ids = turn["token_ids"]
        text_ids = ids[:-1] if ids and ids[-1] in stop_ids else ids
        content = tokenizer.decode(text_ids, skip_special_tokens=True)
        history += [{"role": "user", "content": question}, {"role": "assistant", "content": content, **turn}]
    return {"id": row["id"], "conversations": history}
