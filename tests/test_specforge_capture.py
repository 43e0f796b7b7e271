"""docs/data.md's SpecForge capture route, run as written with SpecForge 0.2.0's own script on the CPU.

The bash block is read from the page; only the model (the tiny chat target and its draft config),
its chat template, the paths and sizes are substituted, and ``torchrun ... scripts/prepare_hidden_states.py``
runs SpecForge's unchanged script through ``tests/specforge_capture/cpu_run.py`` on two gloo CPU
ranks (transformers in place of its SGLang model runner). Then every file must carry the labels of
the conversation it holds, found by its text: SpecForge numbers its files after shuffling the rows
and spreading them over its ranks, and drops each rank's last partial batch.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specforge_outlets.data.features import load_features
from specforge_outlets.data.labels import NO_LABEL, response_spans
from specforge_outlets.model.tiny_chat_target import make_chat_target
from tests.data_fixtures import write_jsonl
from tests.specforge_capture.cpu_run import CHECKOUT_VARIABLE, specforge_script
from tests.tiny_target import write_draft_config

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_RUN = os.path.join(CHECKOUT, "tests", "specforge_capture", "cpu_run.py")

pytestmark = pytest.mark.skipif(
    specforge_script() is None,
    reason=f"needs SpecForge's scripts/prepare_hidden_states.py: set ${CHECKOUT_VARIABLE} to a SpecForge checkout "
           "(sgl-project/SpecForge; its PyPI package ships no scripts/)")


def documented_block() -> str:
    with open(os.path.join(CHECKOUT, "docs", "data.md"), encoding="utf-8") as handle:
        blocks = re.findall(r"```bash\n(.*?)```", handle.read(), flags=re.S)
    (block,) = [block for block in blocks if "prepare_hidden_states.py" in block]
    return block


def turn(role, content, finish=None):
    message = {"role": role, "content": content}
    return {**message, "num_tokens": 0, "finish_reason": finish} if role == "assistant" else message


ROWS = [  # (id, turns); the censoring each file's spans must get, by the conversation it holds
    ("r0", [turn("user", "Q zero"), turn("assistant", "Hello there", "stop")]),
    ("r1", [turn("user", "Q one"), turn("assistant", "A one", "stop"), turn("user", "Q1b"),
            turn("assistant", "A cut", "length")]),
    ("r2", [turn("user", "Q two"), turn("assistant", "Cut short", "length")]),
    ("r3", [turn("user", "Q three"), turn("assistant", "word " * 100, "stop")]),  # runs into --max-length
    ("r4", [turn("user", "Q four"), turn("assistant", "Fine", "stop")]),
]
CENSORED = {"r0": [False], "r1": [False, True], "r2": [True], "r3": [True], "r4": [False]}


def test_the_documented_specforge_capture_runs_and_every_file_gets_its_own_conversations_labels(tmp_path):
    target = make_chat_target(str(tmp_path / "target"))
    draft = write_draft_config(target, str(tmp_path / "outlets-draft.json"))
    regenerated = write_jsonl(tmp_path / "train.regen.jsonl", [{"id": i, "conversations": t} for i, t in ROWS])
    features = tmp_path / "features"
    block = documented_block().replace("\\\n", " ")
    for old, new in (("torchrun --nproc_per_node 8 scripts/prepare_hidden_states.py",
                      f"{sys.executable} -m torch.distributed.run --nproc_per_node 2 {CPU_RUN} --workdir "
                      f"{tmp_path / 'work'} --num-workers 0 --build-dataset-num-proc 1 --num-io-threads 1"),
                     ("outlets ", f"{sys.executable} -m specforge_outlets.cli "),
                     ("meta-llama/Llama-3.1-8B-Instruct", target), ("recipes/drafts/llama3.1-8b-outlets.json", draft),
                     ("data/train.regen.jsonl", regenerated), ("features/", f"{features}/"),
                     ("--chat-template llama3", "--chat-template qwen"), ("2048", "128"),
                     ("--batch-size 32 ", "--batch-size 2 "), ("--specforge-batch-size 32", "--specforge-batch-size 2"),
                     ("--specforge-ranks 8", "--specforge-ranks 2")):
        assert old in block, old
        block = block.replace(old, new)
    commands = [line for line in block.splitlines() if line.strip()]
    assert len(commands) == 3
    for command in commands:
        result = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=600, cwd=CHECKOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
        assert result.returncode == 0, command + "\n" + result.stdout[-3000:] + result.stderr[-3000:]
    # 5 rows on 2 ranks of batch 2: each rank takes 3 of the shuffled rows and drops its last (partial) batch
    assert "1 of the 5 rows SpecForge read have no feature file" in result.stdout
    summary = json.loads((features / "train" / "labels_summary.json").read_text())
    assert summary["files"] == summary["labelled_files"] == 4 and summary.get("skipped", 0) == 0

    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target).eval()
    files = sorted((features / "train").glob("rows_*/data_*.ckpt.gz"))  # --compress: labelled in place, still gzip
    assert [int(path.name.split("_")[1].split(".")[0]) for path in files] == [0, 1, 3, 4]  # rank 1 starts at 3
    held = []
    for path in files:
        data = load_features(str(path), hidden_size=32)
        text = tokenizer.decode(data["input_ids"])
        (row_id,) = [row_id for row_id, turns in ROWS if f"user\n{turns[0]['content']}<|im_end|>" in text]
        held.append(row_id)
        spans = response_spans(data["loss_mask"])
        assert len(spans) == len(CENSORED[row_id]), (path, row_id)
        for (start, end), censored in zip(spans, CENSORED[row_id]):
            expected = NO_LABEL if censored else end - start
            assert int(data["remaining_length"][start]) == expected, (path, row_id, start)
        with torch.no_grad():  # the layers captured are the draft's fusion layers, hidden_states[2, 3, 4]
            states = model(data["input_ids"][None], output_hidden_states=True).hidden_states
        torch.testing.assert_close(data["aux_hidden_state"][0], torch.cat([states[k][0] for k in (2, 3, 4)], -1),
                                   atol=1e-3, rtol=0)  # captured in a padded batch: float32 rounding
    assert len(set(held)) == 4 and held != sorted(held)  # four conversations, not in the JSONL's order
