"""A split of captured features as evaluation requests: one per labelled assistant response.

A request is the span ``[start, start + L)`` of a feature file whose ``remaining_length`` labels
are ``L, L-1, ..., 1``. Censored responses (cut by the token limit) carry no labels and are not
scored; they are kept apart (``Split.censored``, their ``length`` the tokens generated before the
cut, a lower bound) so the predictions file covers every request a server would see. Predictions at
response position ``t`` are read from the state at ``start - 1 + t`` (EAGLE-3's alignment: the
state at the last prompt position predicts the whole length).

The prompt text comes from the regenerated JSONL that ``manifest.json`` names (``input``): the
k-th loss-mask span of a file is the k-th assistant turn of its row, and the request's prompt is
the conversation before that turn. Ids are the row id, or ``<row id>#<k>`` for conversations with
more than one assistant turn.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from specforge_outlets.data.features import FEATURE_SUFFIX, LENGTH_KEY, load_features
from specforge_outlets.data.jsonl import BadLine, iter_jsonl
from specforge_outlets.data.labels import response_spans
from specforge_outlets.data.manifest import MANIFEST, read_manifest
from specforge_outlets.errors import OutletsError



@dataclass(frozen=True)
class Request:
    id: str
    file: str  # feature file path
    start: int  # index of the first response token
    length: int  # L, the true output length in tokens
    messages: Optional[Tuple[Dict[str, str], ...]]  # the prompt conversation, when known
    row_id: str = ""  # the regenerated JSONL row it comes from
    turn: int = 0  # which assistant turn of that row (0: the first)
    censored: bool = False  # cut by the token limit: ``length`` is a lower bound, never scored

    @property
    def prompt_end(self) -> int:
        """The last prompt position, whose state predicts the whole length."""
        return self.start - 1


class Split:
    """The labelled requests of one features directory, in file order (``censored``: the others)."""

    def __init__(self, directory: str, requests: List[Request], manifest: Dict[str, Any], hidden_size: int,
                 censored: Optional[List[Request]] = None):
        self.directory = directory
        self.requests = requests
        self.manifest = manifest
        self.hidden_size = hidden_size
        self.censored = censored or []

    def with_censored(self) -> "Split":
        """Every request, labelled and censored, in file order: what predictors run on once."""
        everything = sorted(self.requests + self.censored, key=lambda r: (_natural_key(r.file), r.start))
        return Split(self.directory, everything, self.manifest, self.hidden_size)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def lengths(self) -> List[int]:
        return [request.length for request in self.requests]

    def files(self) -> List[str]:
        return list(dict.fromkeys(request.file for request in self.requests))

    def by_file(self) -> Iterator[Tuple[str, Dict[str, torch.Tensor], List[Tuple[int, Request]]]]:
        """``(path, features, [(request index, request), ...])`` for each file, loaded once."""
        grouped: Dict[str, List[Tuple[int, Request]]] = {}
        for index, request in enumerate(self.requests):
            grouped.setdefault(request.file, []).append((index, request))
        for path, members in grouped.items():
            yield path, load_features(path, hidden_size=self.hidden_size), members

    def require_messages(self, predictor: str) -> None:
        missing = [request for request in self.requests if request.messages is None]
        if missing:
            raise OutletsError(
                f"{self.directory}: the {predictor} predictor needs the prompt text, but request "
                f"{missing[0].id} ({missing[0].file}) has none: {MANIFEST} must name the regenerated "
                "JSONL as 'input' (written by `outlets capture`) and that file must exist"
            )


def load_split(directory: str, *, hidden_size: Optional[int] = None, name: str = "features") -> Split:
    """Read every feature file of ``directory``; errors name the file."""
    if not os.path.isdir(directory):
        raise OutletsError(f"--{name} {directory}: no such directory")
    paths = sorted(glob.glob(os.path.join(directory, f"*{FEATURE_SUFFIX}")), key=_natural_key)
    if not paths:
        raise OutletsError(f"--{name} {directory}: no *{FEATURE_SUFFIX} feature files (an empty split)")
    manifest = read_manifest(directory)
    ids = {entry["file"]: str(entry["id"]) for entry in manifest.get("files", []) if "file" in entry and "id" in entry}
    rows = _read_rows(manifest, directory)
    if hidden_size is None and manifest.get("hidden_size"):
        hidden_size = int(manifest["hidden_size"])
    requests: List[Request] = []
    for path in paths:
        features = load_features(path, hidden_size=hidden_size)
        hidden_size = int(features["hidden_state"].shape[-1])
        name_ = os.path.basename(path)
        row_id = ids.get(name_, os.path.splitext(name_)[0])
        requests += _file_requests(path, features, row_id, rows.get(row_id))
    labelled = [request for request in requests if not request.censored]
    if not labelled:
        raise OutletsError(
            f"--{name} {directory}: none of its {len(paths)} feature files has a labelled response "
            "(an empty split: every response was censored or unlabelled)"
        )
    return Split(directory, labelled, manifest, int(hidden_size), [r for r in requests if r.censored])


def _file_requests(path: str, features, row_id: str, row: Optional[Dict[str, Any]]) -> List[Request]:
    labels = features[LENGTH_KEY]
    spans = response_spans(features["loss_mask"])
    turns = _assistant_prompts(row, len(spans))
    requests = []
    for k, (start, end) in enumerate(spans):
        if start < 1:
            continue  # a response with no prompt before it
        length = end - start
        request_id = row_id if len(spans) == 1 else f"{row_id}#{k + 1}"
        requests.append(Request(request_id, path, start, length, turns[k] if turns else None, row_id, k,
                                censored=int(labels[start]) != length))
    return requests


def _assistant_prompts(row: Optional[Dict[str, Any]], spans: int) -> Optional[List[Tuple[Dict[str, str], ...]]]:
    """The prompt conversation before each assistant turn, when the row matches the spans."""
    if row is None or not isinstance(row.get("conversations"), list):
        return None
    turns = row["conversations"]
    prompts = []
    for index, turn in enumerate(turns):
        if turn.get("role") == "assistant":
            prompts.append(tuple({"role": t["role"], "content": t["content"]} for t in turns[:index]))
    return prompts[:spans] if len(prompts) >= spans else None


def regenerated_jsonl(manifest: Dict[str, Any], directory: str) -> Optional[str]:
    """The regenerated JSONL the manifest names (``input``, relative to here or the directory), if it exists."""
    source = manifest.get("input")
    if not source:
        return None
    candidates = [source] if os.path.isabs(source) else [source, os.path.join(directory, source)]
    return next((path for path in candidates if os.path.isfile(path)), None)


def generation_limit(split: Split) -> Optional[int]:
    """``max_new_tokens`` of the regeneration, from the summary `outlets regenerate` writes beside its JSONL."""
    from specforge_outlets.data.regenerate_command import side_paths

    source = regenerated_jsonl(split.manifest, split.directory)
    summary = side_paths(source)["summary"] if source else None
    if not summary or not os.path.isfile(summary):
        return None
    try:
        with open(summary, encoding="utf-8") as handle:
            value = json.load(handle).get("settings", {}).get("max_new_tokens")
    except (OSError, json.JSONDecodeError) as exc:
        raise OutletsError(f"{summary}: not readable JSON ({exc})") from exc
    return int(value) if value else None


def _read_rows(manifest: Dict[str, Any], directory: str) -> Dict[str, Dict[str, Any]]:
    found = regenerated_jsonl(manifest, directory)
    if found is None:
        return {}
    rows = {}
    for _, row in iter_jsonl(found):
        if not isinstance(row, BadLine) and "id" in row:
            rows[str(row["id"])] = row
    return rows


def _natural_key(path: str):
    import re

    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", os.path.basename(path))]
