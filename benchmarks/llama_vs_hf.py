"""The llama and hf backends side by side: same prompts, same weights, same sampling settings.

Both engines run SmolLM2-135M-Instruct (llama.cpp on the shipped Q4_1 GGUF, transformers on its
float32 dequantisation), so for the same settings they must give the same distribution of
response lengths, not the same responses (the sampling streams differ). This prints and writes
the length distributions (mean, quantiles, censored share, a two-sample Kolmogorov-Smirnov test
on the finished lengths) and the tokens per second of each engine, measured in one run.

    python benchmarks/llama_vs_hf.py --prompts 64 --max-new-tokens 512 --output runs/llama-vs-hf
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from specforge_outlets.cli import main as outlets
from specforge_outlets.data.generation import STOP
from specforge_outlets.data.jsonl import recover_jsonl
from specforge_outlets.demo.stages import written

ENGINES = {
    "llama": ["--backend", "llama", "--target", "smollm2-135m"],
    "hf": ["--backend", "hf", "--target", "smollm2-135m", "--batch-size", "16"],
}


def ks_statistic(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Two-sample Kolmogorov-Smirnov D and its asymptotic p-value (no scipy in the CPU env)."""
    grid = np.union1d(a, b)
    d = float(np.max(np.abs(np.searchsorted(np.sort(a), grid, "right") / len(a)
                            - np.searchsorted(np.sort(b), grid, "right") / len(b))))
    n = len(a) * len(b) / (len(a) + len(b))
    lam = (np.sqrt(n) + 0.12 + 0.11 / np.sqrt(n)) * d
    p = 2 * sum((-1) ** (k - 1) * np.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return d, float(min(max(p, 0.0), 1.0))


def lengths(path: str) -> tuple[np.ndarray, int, int]:
    rows = recover_jsonl(path) + recover_jsonl(path.replace(".jsonl", ".filtered.jsonl"))
    turns = [row["conversations"][-1] for row in rows]
    finished = np.array([t["num_tokens"] for t in turns if t["finish_reason"] == STOP])
    return finished, len(turns) - len(finished), sum(int(t["num_tokens"]) for t in turns)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64, help="built-in prompts (seeded draw)")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama-server threads")
    parser.add_argument("--output", default="runs/llama-vs-hf")
    args = parser.parse_args()
    out = os.path.abspath(args.output)
    data = os.path.join(out, "data")
    if not written(os.path.join(data, "summary.json")):
        outlets(["prepare", "--dataset", "builtin", "--output", data, "--max-samples", str(args.prompts),
                 "--sample", "random"])
    rows = {}
    for engine, argv in ENGINES.items():
        extra = ["--threads", str(args.threads)] if engine == "llama" else []
        for split in ("train", "test"):  # both splits: all drawn prompts
            output = os.path.join(out, engine, f"{split}.jsonl")
            if written(output.replace(".jsonl", ".summary.json")):
                continue
            started = time.time()
            code = outlets(["regenerate", *argv, *extra, "--resume", "--input", os.path.join(data, f"{split}.jsonl"),
                            "--output", output, "--max-new-tokens", str(args.max_new_tokens)])
            if code:
                raise SystemExit(f"{engine}: regenerate failed ({code})")
            with open(output.replace(".jsonl", ".summary.json")) as handle:
                summary = json.load(handle)
            summary["wall_seconds"] = time.time() - started
            with open(output.replace(".jsonl", ".summary.json"), "w") as handle:
                json.dump(summary, handle, indent=2)
        finished, censored, tokens = [], 0, 0
        seconds = 0.0
        for split in ("train", "test"):
            output = os.path.join(out, engine, f"{split}.jsonl")
            f, c, t = lengths(output)
            finished.append(f)
            censored, tokens = censored + c, tokens + t
            with open(output.replace(".jsonl", ".summary.json")) as handle:
                seconds += json.load(handle)["wall_seconds"]
        f = np.concatenate(finished)
        rows[engine] = {"responses": len(f) + censored, "finished": len(f), "censored": censored,
                        "mean_finished": float(f.mean()), "quantiles_10_50_90": np.percentile(f, [10, 50, 90]).tolist(),
                        "generated_tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
                        "lengths": f.tolist()}  # fmt: skip
    d, p = ks_statistic(np.array(rows["llama"]["lengths"]), np.array(rows["hf"]["lengths"]))
    result = {"settings": {"prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "threads": args.threads},
              "engines": rows, "ks_d": d, "ks_p": p, "speedup": rows["llama"]["tokens_per_s"] / rows["hf"]["tokens_per_s"]}
    with open(os.path.join(out, "result.json"), "w") as handle:
        json.dump(result, handle, indent=2)
    print(f"| engine | responses | censored | mean finished | p10 / p50 / p90 | tokens/s |")
    print("|---|---:|---:|---:|---|---:|")
    for engine, row in rows.items():
        q = " / ".join(f"{v:.0f}" for v in row["quantiles_10_50_90"])
        print(f"| {engine} | {row['responses']} | {row['censored']} | {row['mean_finished']:.1f} | {q} | "
              f"{row['tokens_per_s']:.0f} |")
    print(f"KS on finished lengths: D = {d:.3f}, p = {p:.2f}; llama / hf tokens per second: x{result['speedup']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
