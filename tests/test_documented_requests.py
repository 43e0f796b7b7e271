"""The docs' requests as a user pastes them: SGLang 0.5.23 answers 400 to a JSON body sent without its
content type, and ``python -m sglang.bench_serving`` is its deprecated alias of ``sglang.benchmark.serving``."""

import glob
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [os.path.join(REPO, "README.md"), *sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))]


def read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def test_every_documented_curl_with_a_json_body_sends_its_content_type():
    bodies = [(path, command) for path in DOCS for command in re.findall(r"^curl .*$", read(path), re.M)
              if " -d " in command]
    assert len(bodies) >= 3, bodies  # docs/serving.md's requests
    for path, command in bodies:
        assert "-H 'Content-Type: application/json'" in command, f"{os.path.relpath(path, REPO)}: {command}"


def test_the_docs_run_sglangs_benchmark_by_its_current_module():
    for path in DOCS:
        assert "-m sglang.bench_serving" not in read(path), os.path.relpath(path, REPO)
