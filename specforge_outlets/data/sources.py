"""Where prompts come from: hub datasets, local JSON/JSONL files, or the built-in prompt set.

Hub datasets are read with ``datasets`` (for users who have the hub). Local files are read line
by line instead of through ``datasets``' JSON loader: that loader stops at the first malformed
line and infers one Arrow schema for all rows, which real chat dumps break; reading ourselves lets
each bad line be reported by number and skipped.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any, Iterator, Optional, Tuple, Union

from specforge_outlets.data.jsonl import BadLine, iter_jsonl
from specforge_outlets.errors import OutletsError

HUB_DATASETS = {
    "sharegpt": ("anon8231489123/ShareGPT_Vicuna_unfiltered", "ShareGPT_V3_unfiltered_cleaned_split.json"),
    "alpaca": ("tatsu-lab/alpaca", None),
    "lmsys": ("lmsys/lmsys-chat-1m", None),
}
DATASETS = (*HUB_DATASETS, "jsonl", "builtin")

# (where: "file:line" or "name[index]", row or BadLine)
SourceRow = Tuple[str, Union[dict, BadLine]]


def builtin_prompts_path() -> str:
    return str(resources.files("specforge_outlets.data").joinpath("builtin", "prompts.jsonl"))


def iter_source(dataset: str, path: Optional[str] = None) -> Iterator[SourceRow]:
    """Raw rows of ``dataset``, from ``path`` when given, else from the hub (or the package)."""
    if dataset not in DATASETS:
        raise OutletsError(f"--dataset {dataset!r} is not known; choose one of {', '.join(DATASETS)}")
    if dataset == "builtin":
        path = path or builtin_prompts_path()
    if path:
        return _iter_local(path)
    if dataset == "jsonl":
        raise OutletsError("--dataset jsonl needs --path FILE (a JSON or JSONL file)")
    return _iter_hub(dataset)


def _iter_local(path: str) -> Iterator[SourceRow]:
    try:
        with open(path, "r", encoding="utf-8") as handle:
            head = handle.read(4096).lstrip()
    except OSError as exc:
        raise OutletsError(f"--path {path}: cannot read ({exc.strerror})") from exc
    if head.startswith("["):  # one JSON array (ShareGPT's .json files)
        try:
            with open(path, "r", encoding="utf-8") as handle:
                rows = json.load(handle)
        except json.JSONDecodeError as exc:
            raise OutletsError(f"{path}: malformed JSON array ({exc}); fix the file or convert it to JSONL") from exc
        for index, row in enumerate(rows):
            where = f"{path}[{index}]"
            yield where, row if isinstance(row, dict) else BadLine(f"{where}: expected a JSON object")
        return
    for number, row in iter_jsonl(path):
        yield f"{path}:{number}", row


def _iter_hub(dataset: str) -> Iterator[SourceRow]:
    name, data_file = HUB_DATASETS[dataset]
    try:
        import datasets

        kwargs: dict[str, Any] = {"split": "train"}
        if data_file:
            kwargs["data_files"] = data_file
        rows = datasets.load_dataset(name, **kwargs)
    except Exception as exc:  # offline, gated or renamed: say how to proceed without the hub
        raise OutletsError(
            f"--dataset {dataset}: cannot load {name} from the Hugging Face hub ({exc}); "
            "download it and pass the file with --path"
        ) from exc
    for index, row in enumerate(rows):
        yield f"{name}[{index}]", row
