"""Helpers of the data-pipeline tests: a stub OpenAI-compatible server, one command run in-process,
JSONL files. Everything is local; nothing touches the network. The tiny chat target and its
tokenizer are the package's (``specforge_outlets.model.tiny_chat_target``), which benchmarks use too.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, Tuple


class StubChatServer:
    """OpenAI-compatible ``/v1/chat/completions`` on 127.0.0.1 whose answers depend on the prompt.

    The last user message decides: ``flaky`` -> HTTP 500 on the first attempt; ``slow`` -> sleeps
    ``slow_seconds`` on the first attempt (longer than the client timeout); ``broken`` -> always 500;
    ``huge`` -> HTTP 400 (not retried); ``ramble`` -> cut by max_tokens (finish_reason "length").
    Otherwise the answer has ``len(prompt words)`` words and ends ("stop").
    """

    def __init__(self, slow_seconds: float = 1.0) -> None:
        self.requests: Counter[str] = Counter()
        self.slow_seconds = slow_seconds
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, payload = server.answer(body)
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def answer(self, body: Dict) -> Tuple[int, Dict]:
        prompt = body["messages"][-1]["content"]
        self.requests[prompt] += 1
        attempt = self.requests[prompt]
        if "broken" in prompt or ("flaky" in prompt and attempt == 1):
            return 500, {"error": "internal error"}
        if "huge" in prompt:
            return 400, {"error": "prompt is longer than the model's context length"}
        if "slow" in prompt and attempt == 1:
            time.sleep(self.slow_seconds)
        words = len(prompt.split())
        if "ramble" in prompt:
            count, finish = body["max_tokens"], "length"
        else:
            count, finish = words + 1, "stop"  # the end-of-turn token counts
        content = " ".join(["word"] * (count if finish == "length" else words))
        return 200, {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}],
            "usage": {"prompt_tokens": words, "completion_tokens": count},
        }

    def __enter__(self) -> "StubChatServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def run_command(module, argv) -> int:
    """Run one ``outlets`` sub-command in-process through its own parser (no other commands)."""
    import argparse

    parser = argparse.ArgumentParser(prog="outlets")
    module.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args([str(arg) for arg in argv])
    return args.func(args)


def write_jsonl(path, rows) -> str:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return str(path)


def read_jsonl(path):
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
