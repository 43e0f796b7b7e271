"""docs/serving.md's "From install to a served request", run as written on the CPU (serve environment).

The commands are read from the page's bash blocks (steps 2, 3 and 5), so the page cannot drift from
what runs: data (prepare, regenerate, capture), `outlets train` and `outlets export` in the training
environment (``$T``: .venv/bin), then the predictor-only server and the request in this one. The
paths chain as on the page, all relative to one working directory: data/ -> features/ -> outputs/ ->
drafts/ -> the server.

Only what a CPU without network needs is substituted, and each substitution must match the page
(else the test fails naming it): the tiny random chat target for the page's model; the package's
built-in prompts (local ``--path``) for the ShareGPT download; a stub OpenAI server for the stock
SGLang server that regenerates, so that one real server starts (the OUTLETS one, 60-80 s); CPU for
CUDA, one training process, small sizes; and the recipe's target, draft shape and fusion layers for
the tiny target (:func:`tiny_training`). Step 5's EAGLE-3 server is not started: its flags are checked
against what `outlets export` printed, as the predictor-only server's are. The README's GPU section
repeats some of these commands, shortened: each must be one of the page's with arguments left out.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
from typing import Dict, List

import pytest

pytest.importorskip("sglang", reason="SGLang tests run in the serve environment (make test)")

from specforge_outlets.data.sources import builtin_prompts_path  # noqa: E402
from specforge_outlets.data.weight_index import write_weight_index  # noqa: E402
from specforge_outlets.model.tiny_chat_target import make_chat_target  # noqa: E402
from tests.data_fixtures import StubChatServer  # noqa: E402
from tests.sglang_harness.offline_reference import TRAIN_PYTHON, training_env  # noqa: E402
from tests.sglang_harness.server import REPO, start_server  # noqa: E402
from tests.tiny_target import write_draft_config  # noqa: E402

DOC = os.path.join(REPO, "docs", "serving.md")
SECTION = "## From install to a served request"
README_SECTION = "## On GPU servers"
DOC_TARGET = "meta-llama/Llama-3.1-8B-Instruct"
DOC_REGEN_URL = "http://127.0.0.1:30000/v1"  # the stock server step 2 regenerates against
PRIOR = 256.0
# (flag, the page's value) -> the value run here
CPU_VALUES = {
    ("--device", "cuda"): "cpu",
    ("--concurrency", "64"): "4",
    ("--max-new-tokens", "2048"): "24",
}
# whole arguments of the page -> the ones run here
CPU_ARGUMENTS = {"deployment.trainer.nproc_per_node=8": "deployment.trainer.nproc_per_node=1"}


def tiny_training(target: str, draft_config: str) -> List[str]:
    """Overrides after the page's `outlets train` arguments: the tiny target and a CPU-sized run."""
    return [f"model.target_model_path={target}", f"model.draft_model_config={draft_config}",
            "model.torch_dtype=float32", "data.max_length=256", "training.num_epochs=1",
            "training.fsdp_sharding=NO_SHARD", "tracking.report_to=none", "outlets.fusion_layers=[2,3,4]"]


def section(path: str, heading: str) -> str:
    with open(path) as handle:
        text = handle.read()
    assert heading in text, f"{path} has no {heading!r}"
    text = text[text.index(heading):]
    return text[:text.index("\n## ", 1)]


def doc_step(number: int) -> str:
    """The bash blocks under step ``number``'s heading of the page's walkthrough, one after the other."""
    step = re.search(rf"\n### {number}\. .*?(?=\n### |\Z)", section(DOC, SECTION), re.S)
    assert step, f"docs/serving.md has no step {number} under {SECTION!r}"
    blocks = re.findall(r"```bash\n(.*?)```", step.group(0), re.S)
    assert blocks, f"docs/serving.md step {number} has no bash block"
    return "\n".join(blocks)


def commands(block: str) -> List[List[str]]:
    """The block's commands as argument lists: continued lines joined, comments and a trailing ``&``
    dropped, ``for VAR in A B; do ... done`` unrolled (``$VAR`` substituted)."""
    result: List[List[str]] = []
    loop = None
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] == "for" and words[-1] == "do":
            loop = (words[1], [word.rstrip(";") for word in words[3:-1]], [])
        elif words == ["done"]:
            name, values, body = loop
            result += [[word.replace(f"${name}", value) for word in command] for value in values for command in body]
            loop = None
        else:
            (loop[2] if loop else result).append([word for word in words if word != "&"])
    return result


class Substitutions:
    """The CPU stand-ins for the page's values, each required to occur on the page."""

    def __init__(self, values: Dict[tuple, str], arguments: Dict[str, str]) -> None:
        self.values, self.arguments, self.used = values, arguments, set()

    def __call__(self, argv: List[str]) -> List[str]:
        out = []
        for index, word in enumerate(argv):
            key = (argv[index - 1], word) if index else None
            if key in self.values:
                self.used.add(key)
                word = self.values[key]
            elif word in self.arguments:
                self.used.add(word)
                word = self.arguments[word]
            out.append(word)
        return out

    def check_all_used(self) -> None:
        unused = [key for key in [*self.values, *self.arguments] if key not in self.used]
        assert not unused, f"docs/serving.md no longer has {unused}: update this test's substitutions"


def server_flags(argv: List[str]) -> List[str]:
    """A page's ``$S/python -m sglang.launch_server`` command without its model and port (the test's own)."""
    assert argv[:3] == ["$S/python", "-m", "sglang.launch_server"], argv
    flags = argv[3:]
    for flag in ("--model-path", "--port"):
        index = flags.index(flag)
        del flags[index:index + 2]
    return flags


def test_the_documented_commands_chain_from_data_to_a_served_prediction(tmp_path):
    train_bin = os.path.dirname(TRAIN_PYTHON)
    if not os.path.exists(os.path.join(train_bin, "outlets")):
        pytest.skip(f"the training environment ({train_bin}) runs the page's $T commands (make install)")
    work = tmp_path / "checkout"  # the page's commands run from the checkout: recipes/ is relative
    work.mkdir()
    os.symlink(os.path.join(REPO, "recipes"), work / "recipes")
    target = make_chat_target(str(tmp_path / "target"))
    write_weight_index(target)
    draft_config = write_draft_config(target, str(tmp_path / "draft.json"))
    extra = {"prepare": ["--path", builtin_prompts_path(), "--max-samples", "12"],
             "train": tiny_training(target, draft_config)}
    ran: Dict[str, List[str]] = {}  # subcommand -> its last command line
    printed: Dict[str, str] = {}  # subcommand -> what its runs printed

    def outlets(argv: List[str]) -> None:
        command = [os.path.join(train_bin, "outlets"), *argv[1:], *extra.get(argv[1], [])]
        result = subprocess.run(command, cwd=work, env={**training_env(), "WANDB_MODE": "offline"},
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"{shlex.join(argv)}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        ran[argv[1]] = argv
        printed[argv[1]] = printed.get(argv[1], "") + result.stdout

    with StubChatServer() as stub:
        substitute = Substitutions({**CPU_VALUES, ("--base-url", DOC_REGEN_URL): stub.url},
                                   {**CPU_ARGUMENTS, DOC_TARGET: target})
        # 2 and 3: data, training and export, in the training environment
        for step in (2, 3):
            for argv in map(substitute, commands(doc_step(step))):
                if argv[0] == "$S/python":  # step 2's stock server: the stub stands in for it
                    assert not [word for word in server_flags(argv) if "outlets" in word], argv
                    continue
                assert argv[0] == "$T/outlets", argv
                if argv[1] != "eval":  # optional on the page (scores only); no step below reads it
                    outlets(argv)
    assert stub.requests, "regenerate sent nothing to the stand-in of the stock server"
    for split in ("train", "test"):
        assert os.path.isfile(work / "features" / split / "manifest.json")
    assert "wrote " in printed["capture"] and " feature files" in printed["capture"]
    export = ran["export"][ran["export"].index("--output") + 1]
    with open(work / export / "config.json") as handle:
        assert json.load(handle)["architectures"] == ["OutletsLlamaForCausalLMEagle3"]

    # 5: each documented server's flags are a mode `outlets export` printed for this export
    servers = [substitute(argv) for argv in commands(doc_step(5)) if argv[0] == "$S/python"]
    assert len(servers) == 2, servers  # predictor-only, then EAGLE-3
    for argv in servers:
        assert f": {shlex.join(server_flags(argv))}\n" in printed["export"], (argv, printed["export"])
    substitute.check_all_used()

    # the predictor-only server, started from the working directory (the draft's path is relative)
    server = start_server(target, str(tmp_path), server_flags(servers[0]), cwd=str(work))
    try:
        assert f"mode=predictor-only (OUTLETS draft {export})" in server.log_text()
        [curl] = [argv for argv in commands(doc_step(5)) if argv[0] == "curl"]
        path = re.search(r"localhost:\d+(/\S+)", " ".join(curl)).group(1)
        response = server.post(path, json.loads(curl[curl.index("-d") + 1]))
    finally:
        server.stop()
    predicted = response["meta_info"]["predicted_output_len"]  # the draft's r̂0 (the page's comment)
    assert math.isfinite(predicted) and predicted > 0 and predicted != PRIOR, response["meta_info"]


def test_the_readme_gpu_commands_are_the_pages_shortened():
    page = [argv for step in (2, 3, 5) for argv in commands(doc_step(step))]
    blocks = re.findall(r"```\w*\n(.*?)```", section(os.path.join(REPO, "README.md"), README_SECTION), re.S)
    readme = [argv for block in blocks for argv in commands(block) if argv[0] in ("$T/outlets", "$S/python")]
    assert len(readme) >= 6, readme
    for argv in readme:
        assert any(argv[:2] == full[:2] and set(argv) <= set(full) for full in page), \
            f"README.md's {shlex.join(argv)} is none of docs/serving.md's commands (arguments may be left out)"
