"""Regenerate one split with several engine processes, one per CPU core, then merge their output.

On a small CPU machine one llama-server with one thread per core beats one server with all cores
(llama.cpp's thread barrier stalls whenever anything else runs: docs/data.md). Each worker gets a
disjoint shard of a seeded shuffle of the prompts not yet answered, so a run stopped early leaves a
random subset answered, not the longest or shortest prompts of a sorted source. Each request's
seed depends only on ``--seed`` and the prompt, so the labels do not depend on the sharding.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from typing import List, Sequence

from specforge_outlets.data.jsonl import AppendWriter, recover_jsonl, write_jsonl
from specforge_outlets.data.regenerate_command import answered_ids, side_paths
from specforge_outlets.errors import OutletsError

# Seconds between progress updates while the workers run.
POLL_S = 10.0


def shard_path(output: str, index: int) -> str:
    return output.replace(".jsonl", f".shard{index}.jsonl")


def _shard_input(output: str, index: int) -> str:
    return shard_path(output, index).replace(".jsonl", ".input.jsonl")


def merge_shards(output: str, workers: int) -> int:
    """Append the rows of every ``output``'s shard files not yet in ``output``; remove the shards."""
    seen = answered_ids(output)
    merged = 0
    for index in range(workers):
        shard = shard_path(output, index)
        shard_sides = side_paths(shard)
        for source, target in ((shard, output), (shard_sides["filtered"], side_paths(output)["filtered"])):
            rows = [row for row in recover_jsonl(source) if row.get("id") not in seen]
            with AppendWriter(target) as writer:
                for row in rows:
                    writer.write(row)
            seen.update(row.get("id") for row in rows)
            merged += len(rows)
        for leftover in (shard, shard_sides["filtered"], shard_sides["summary"], _shard_input(output, index)):
            if os.path.exists(leftover):
                os.remove(leftover)
    return merged


def regenerate_sharded(source: str, output: str, workers: int, argv: Sequence[str], seed: int = 0) -> None:
    """Answer the prompts of ``source`` missing from ``output`` with ``workers`` pinned processes.

    ``argv`` holds the ``outlets regenerate`` options other than ``--input``/``--output``/``--resume``.
    Shards left by an interrupted run are merged first, so nothing is generated twice.
    """
    if workers < 1:
        raise OutletsError(f"--workers {workers}: needs at least one worker")
    cores = sorted(os.sched_getaffinity(0))  # worker i is pinned to core i (round robin past the last)
    merge_shards(output, workers)
    done = answered_ids(output)
    pending = [row for row in recover_jsonl(source) if str(row["id"]) not in done]
    if not pending:
        return
    random.Random(seed).shuffle(pending)
    processes: List[subprocess.Popen] = []
    logs = []
    for index in range(workers):
        write_jsonl(_shard_input(output, index), pending[index::workers])
        logs.append(open(shard_path(output, index).replace(".jsonl", ".log"), "a", encoding="utf-8"))
        command = [sys.executable, "-m", "specforge_outlets.cli", "regenerate", *argv, "--resume",
                   "--input", _shard_input(output, index), "--output", shard_path(output, index)]  # fmt: skip
        processes.append(subprocess.Popen(command, stdout=logs[-1], stderr=subprocess.STDOUT,
                                          preexec_fn=lambda core=cores[index % len(cores)]: os.sched_setaffinity(0, {core})))
    print(f"{len(pending)} prompts on {workers} workers (logs: {shard_path(output, 0).replace('.jsonl', '.log')}, ...)")
    try:
        _wait(processes, output, workers, len(pending))
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            process.wait()
        for log in logs:
            log.close()
        merge_shards(output, workers)
    failed = [index for index, process in enumerate(processes) if process.returncode != 0]
    if failed:
        raise OutletsError(f"regeneration worker(s) {failed} failed; see their logs next to {output}; "
                           "rerun to resume (answered prompts are kept)")


def _wait(processes: List[subprocess.Popen], output: str, workers: int, total: int) -> None:
    from tqdm import tqdm

    with tqdm(total=total, desc=f"regenerate ({workers} workers)", unit="conv") as bar:
        while any(process.poll() is None for process in processes):
            time.sleep(POLL_S)
            answered = sum(_count_lines(path) for index in range(workers)
                           for path in (shard_path(output, index), side_paths(shard_path(output, index))["filtered"]))
            bar.update(answered - bar.n)


def _count_lines(path: str) -> int:
    """Complete lines of a file a worker is appending to (read only: never truncates it)."""
    if not os.path.exists(path):
        return 0
    with open(path, "rb") as handle:
        return handle.read().count(b"\n")
