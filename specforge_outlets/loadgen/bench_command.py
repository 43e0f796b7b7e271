"""``outlets bench-serving``: drive real servers and summarize them like the simulator does.

SGLang's ``python -m sglang.benchmark.serving`` generates load and records requests, but it has no trace
replay at the trace's own arrival times, no short/long breakdown, keeps no ``meta_info`` (the server's
length prediction) and writes its own metric names. This command sends the same native ``/generate``
requests (client.py), schedules them from a dataset at a Poisson rate or from a trace
(workload.py), and summarizes them with the simulator's metrics (``serving/metrics.py``) into the
simulator's ``summary.json`` schema, so ``outlets compare-runs`` puts a measured run next to
simulated ones. Each row also carries ``sglang.benchmark.serving``'s own result keys and units
(``sglang_result.py``: ``p99_ttft_ms``, ``median_e2e_latency_ms``, ``output_throughput``,
``total_throughput``, ``max_concurrent_requests``, ``request_goodput``), computed as it computes them.

Outputs (``--output DIR``): ``requests.jsonl`` (one record per request, failures included),
``summary.json``, ``summary.md``. They are written to temporary names and renamed when the run is
complete, ``summary.json`` last: an interrupted run leaves the previous results (if any) untouched
and never a finished-looking summary of a partial run.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import math
import os
import time
from typing import Dict, List, Optional, Sequence

from specforge_outlets import wandb_report


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench-serving",
        help="benchmark real SGLang servers; same summary schema as `outlets simulate`",
        description=(
            "Send streaming native /generate requests to one or more servers (round-robin), from a prompt "
            "dataset at a Poisson rate or from a trace at its own arrival times, and write requests.jsonl, "
            "summary.json (the simulator's schema: all/short/long latency percentiles and throughput, "
            "failures counted as infinite latency) and summary.md."
        ),
    )
    parser.add_argument("--base-url", action="append", required=True,
                        help="server URL, e.g. http://127.0.0.1:30000; repeat for several servers (round-robin)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--dataset", help="JSONL of prompt (or messages/conversations) [, id, output_length]")
    source.add_argument("--trace", help="Azure CSV or JSONL trace, replayed at its arrival times with synthetic prompts")
    parser.add_argument("--rate", type=float, help="--dataset: Poisson arrival rate in requests/s; inf = all at once")
    parser.add_argument("--rate-scale", type=float, default=1.0, help="--trace: divide arrival times by this (default 1)")
    parser.add_argument("--output", required=True, help="directory for requests.jsonl, summary.json, summary.md")
    parser.add_argument("--label", help="name of the run in summaries (default: the output directory's name)")
    parser.add_argument("--num-requests", type=int, help="send only the first N requests")
    parser.add_argument("--tokenizer", help="local tokenizer directory: chat template for dataset prompts (sent as "
                                            "token ids), vocabulary for trace prompts")
    parser.add_argument("--raw-prompts", action="store_true", help="--dataset: send prompts as text, no chat template")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="--dataset: per request (default 256)")
    parser.add_argument("--fixed-output-len", action="store_true",
                        help="--dataset: generate exactly each row's output_length (ignore_eos), so that runs under "
                             "different policies do the same work")
    parser.add_argument("--end-at-output-len", type=int, metavar="STOP_TOKEN_ID",
                        help="--dataset: generate exactly each row's output_length with --max-new-tokens kept as the "
                             "cap: the server ends the request there by forcing STOP_TOKEN_ID, the model's end-of-turn "
                             "id (SmolLM2: 2), and forbids it before (a custom logit processor; start the server with "
                             "--enable-custom-logit-processor). Unlike --fixed-output-len, the server does not learn "
                             "the lengths from max_new_tokens, which SGLang's lof order and KV admission read")
    parser.add_argument("--oracle-prediction", action="store_true",
                        help="with --fixed-output-len or --end-at-output-len: send each request's exact length as its "
                             "prediction (custom_params.outlets_predicted_output_len), the oracle upper bound")
    parser.add_argument("--predictions", help="--dataset: JSONL of id, predicted_output_len (e.g. outlets eval's "
                                              "predictions/outlets.jsonl) sent with each request it names; a row "
                                              "may add quantile_levels and quantiles (the total output length's, "
                                              "as outlets simulate reads them), sent as "
                                              "custom_params.outlets_predicted_quantiles: the server's "
                                              "--outlets-quantile-levels must be the file's")
    parser.add_argument("--through-router", action="store_true",
                        help="--base-url is an sglang-router: send each request's prediction, quantiles and "
                             "end-at-length settings in custom_labels, which the router passes on and the plugin on "
                             "each worker moves into custom_params (the router drops custom_params on /generate); "
                             "the workers need the plugin installed, whatever their policy")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--short-threshold", type=int, default=800,
                        help="short requests: fewer generated (or, if failed, expected) tokens (default 800)")
    parser.add_argument("--goodput", nargs="+", metavar="METRIC:MS",
                        help="SLO targets in ms by sglang.benchmark.serving's --goodput names, e.g. ttft:500 tpot:50 "
                        "e2el:9000 (e2e is read as e2el): adds slo_attainment and goodput_rps (requests within every "
                        "target per second) per length class, and SGLang's request_goodput")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request before it counts as failed")
    parser.add_argument("--max-concurrency", type=int, help="at most this many requests in flight")
    parser.add_argument("--seed", type=int, default=0, help="Poisson arrivals and synthetic prompts")
    wandb_report.add_arguments(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from specforge_outlets.loadgen.client import SamplingSettings, check_server
    from specforge_outlets.loadgen.sglang_result import sglang_result
    from specforge_outlets.loadgen.workload import (
        load_dataset_workload, load_tokenizer, load_trace_workload,
    )
    from specforge_outlets.evaluation.predictions_file import predictions_by_id
    from specforge_outlets.serving.metrics import parse_goodput
    from specforge_outlets.serving.summary import summary_rows_table
    from specforge_outlets.simulation.predicted_lengths import read_file_quantiles

    _validate(args)
    wandb_report.check_login(args)
    slo = parse_goodput(args.goodput)  # before any request is sent: a bad target is refused at once
    urls = [url.rstrip("/") for url in args.base_url]
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer and not args.raw_prompts else None
    # the simulator's reader and checks, so that a file sends the server the quantiles outlets simulate reads
    file_quantiles = read_file_quantiles(args.predictions) if args.predictions else None
    if args.dataset:
        workload = load_dataset_workload(args.dataset, args.rate, args.max_new_tokens, tokenizer,
                                         args.num_requests, args.seed, fixed_output_len=args.fixed_output_len,
                                         oracle_prediction=args.oracle_prediction,
                                         predictions=predictions_by_id(args.predictions) if args.predictions else None,
                                         end_token_id=args.end_at_output_len,
                                         quantiles=file_quantiles.static if file_quantiles else None)
        if args.predictions:
            _report_predictions(args.predictions, workload.requests, file_quantiles.levels)
    else:
        workload = load_trace_workload(args.trace, args.rate_scale, tokenizer, args.num_requests, args.seed)
    for url in urls:
        check_server(url)

    label = args.label or os.path.basename(os.path.normpath(args.output))
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    print(f"bench-serving {label}: {len(workload.requests)} requests from {workload.source['path']} "
          f"at {workload.offered_rps:g} req/s to {', '.join(urls)}")
    sampling = SamplingSettings(args.temperature, args.top_p)
    started = time.perf_counter()
    records = asyncio.run(_drive(workload.requests, urls, sampling, args.timeout, args.max_concurrency,
                                 args.through_router))
    duration_s = time.perf_counter() - started

    metrics = summarize_records(records, args.short_threshold, slo)
    header = {
        "kind": "bench-serving",
        "base_urls": urls,
        "source": workload.source,
        "rate": args.rate if args.dataset else None,
        "rate_scale": args.rate_scale if args.trace else None,
        "num_requests": len(records),
        "skipped_rows": workload.skipped_rows,
        "short_threshold": args.short_threshold,
        "slo_s": slo or None,
        "max_new_tokens": args.max_new_tokens if args.dataset else "trace output_length (ignore_eos)",
        "end_at_output_len": args.end_at_output_len,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "tokenizer": args.tokenizer,
        "max_concurrency": args.max_concurrency,
        "timeout_s": args.timeout,
        "seed": args.seed,
        "oracle_prediction": args.oracle_prediction,
        "predictions": args.predictions,
        "quantiles": _quantiles_sent(workload.requests, file_quantiles),
        "through_router": args.through_router,
        "started_at": started_at,
        "duration_s": duration_s,
    }
    row = {"label": label, "offered_rps": workload.offered_rps, **sglang_result(records, duration_s, slo),
           "metrics": metrics}
    for path in write_outputs(args.output, header, row, records):
        print(f"wrote {path}")
    wandb_report.log_run(args, "bench-serving", args.output, header,
                         {"summary": summary_rows_table([row])})
    failed = [record for record in records if not record.success]
    if failed:
        print(f"WARNING: {len(failed)} of {len(records)} requests failed (first: {failed[0].id}: {failed[0].error}); "
              f"they count as infinite latency in the percentiles; see {os.path.join(args.output, 'requests.jsonl')}")
    return 1 if failed and len(failed) == len(records) else 0


def _report_predictions(path: str, requests, levels) -> None:
    """Say how many requests the --predictions file gives a prediction and quantiles: a file for other
    requests would otherwise pass as a run with predictions."""
    with_prediction = sum(request.predicted_output_len is not None for request in requests)
    if with_prediction < len(requests):
        print(f"warning: --predictions {path} names {with_prediction} of {len(requests)} requests; the others get "
              "the server's prior")
    with_quantiles = sum(request.quantiles is not None for request in requests)
    if with_quantiles:
        print(f"--predictions {path}: quantiles at levels {','.join(f'{level:g}' for level in levels)} with "
              f"{with_quantiles} of {len(requests)} requests (the server's --outlets-quantile-levels must be these)")


def _quantiles_sent(requests, file_quantiles) -> Optional[Dict]:
    """summary.json's record of the quantiles sent: their levels and how many requests carried them; None: none."""
    count = sum(request.quantiles is not None for request in requests)
    return {"levels": list(file_quantiles.levels), "requests": count} if count else None


def _validate(args) -> None:
    from specforge_outlets.errors import OutletsError

    if args.dataset:
        if args.rate is None:
            raise OutletsError("--dataset needs --rate R (requests/s, Poisson; inf sends everything at once)")
        if not args.rate > 0:
            raise OutletsError(f"--rate must be a positive number of requests/s (or inf for a burst), got {args.rate}")
        if not args.tokenizer and not args.raw_prompts:
            raise OutletsError("--dataset needs --tokenizer DIR (render prompts with its chat template) or --raw-prompts")
        if args.max_new_tokens < 1:
            raise OutletsError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
        if args.rate_scale != 1.0:
            raise OutletsError("--rate-scale is for --trace; set the dataset's arrival rate with --rate")
        if args.oracle_prediction and args.predictions:
            raise OutletsError("--oracle-prediction and --predictions both set the prediction; choose one")
        if args.fixed_output_len and args.end_at_output_len is not None:
            raise OutletsError("--fixed-output-len and --end-at-output-len both fix the output length; choose one")
        if args.end_at_output_len is not None and args.end_at_output_len < 0:
            raise OutletsError(f"--end-at-output-len takes the stop token id (>= 0), got {args.end_at_output_len}")
        if args.oracle_prediction and not (args.fixed_output_len or args.end_at_output_len is not None):
            raise OutletsError("--oracle-prediction needs --fixed-output-len or --end-at-output-len "
                               "(only then is the length known exactly)")
    else:
        if args.rate is not None:
            raise OutletsError("--rate is for --dataset; a trace brings its own arrival times (use --rate-scale)")
        if args.raw_prompts:
            raise OutletsError("--raw-prompts is for --dataset; trace prompts are synthetic token ids")
        if args.fixed_output_len or args.end_at_output_len is not None or args.oracle_prediction or args.predictions:
            raise OutletsError("--fixed-output-len, --end-at-output-len, --oracle-prediction and --predictions are for "
                               "--dataset; a trace request always generates its output_length")
    checks = (
        (args.num_requests is None or args.num_requests >= 1, f"--num-requests must be at least 1, got {args.num_requests}"),
        (args.short_threshold >= 1, f"--short-threshold must be at least 1, got {args.short_threshold}"),
        (args.timeout > 0, f"--timeout must be positive, got {args.timeout}"),
        (args.max_concurrency is None or args.max_concurrency >= 1,
         f"--max-concurrency must be at least 1, got {args.max_concurrency}"),
        (args.temperature >= 0, f"--temperature must be non-negative, got {args.temperature}"),
        (0 < args.top_p <= 1, f"--top-p must be in (0, 1], got {args.top_p}"),
        (args.rate_scale > 0 and math.isfinite(args.rate_scale), f"--rate-scale must be a positive number, got {args.rate_scale}"),
    )
    for ok, message in checks:
        if not ok:
            raise OutletsError(message)
    if os.path.exists(args.output) and not os.path.isdir(args.output):
        raise OutletsError(f"--output {args.output} is a file; give a directory")


async def _drive(requests, urls: Sequence[str], sampling, timeout_s: float, max_concurrency: Optional[int],
                 through_router: bool = False):
    """Send every request at its arrival time, round-robin over ``urls``; records in request order."""
    import httpx
    from tqdm import tqdm

    from specforge_outlets.loadgen.client import send_request

    limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()
    progress = tqdm(total=len(requests), desc="requests", unit="req")
    failures = 0

    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as client:
        start = time.perf_counter()

        async def one(index: int, request):
            nonlocal failures
            async with gate:
                record = await send_request(client, urls[index % len(urls)], request, sampling, start, timeout_s,
                                            through_router)
            failures += not record.success
            progress.set_postfix(failed=failures, refresh=False)
            progress.update(1)
            return record

        tasks = []
        for index, request in enumerate(requests):
            delay = start + request.arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(index, request)))
        records = await asyncio.gather(*tasks)
    progress.close()
    return list(records)


def summarize_records(records, short_threshold: int, slo=None, charge_s: float = 0.0) -> Dict[str, Dict[str, float]]:
    """The simulator's metrics from client records (times relative to the run's start).

    ``charge_s``: seconds before its sending that each request's latencies count from, e.g. a prefill-only
    pass that had to run before the batch was sent (its TTFT, end-to-end and the makespan then include it).
    """
    import numpy as np

    from specforge_outlets.serving.metrics import summarize_requests

    if not (charge_s >= 0 and math.isfinite(charge_s)):
        raise ValueError(f"charge_s must be a finite number of seconds >= 0, got {charge_s}")
    sent = np.array([record.sent_s for record in records], dtype=np.float64)
    ttft = np.array([math.nan if record.ttft_s is None else record.ttft_s for record in records], dtype=np.float64)
    e2e = np.array([record.e2e_s for record in records], dtype=np.float64)
    success = np.array([record.success for record in records], dtype=bool)
    outputs = np.array([record.output_len for record in records], dtype=np.float64)
    # A request that did not finish is classified by the length it was expected to reach (or had already passed).
    class_lens = np.where(success, outputs, np.maximum(outputs, [record.expected_output_len for record in records]))
    gaps = [np.asarray(record.itl_s, dtype=np.float64) for record in records]

    def token_gaps(mask):
        selected = [gap for gap, chosen in zip(gaps, mask) if chosen]
        values = np.concatenate(selected) if selected else np.zeros(0)
        return values, np.ones(len(values))

    return summarize_requests(sent - charge_s, sent + ttft, sent + e2e, outputs, class_lens=class_lens, success=success,
                              short_threshold=short_threshold, slo=slo, token_gaps=token_gaps)


def write_outputs(output_dir: str, header: Dict, row: Dict, records) -> List[str]:
    """Write every file atomically, summary.json last: an interrupted run leaves the previous results untouched."""
    from specforge_outlets.atomic import write_text_atomic
    from specforge_outlets.serving.summary import write_summary
    from specforge_outlets.strict_json import json_safe

    requests = "".join(json.dumps(json_safe(record.to_json()), allow_nan=False) + "\n" for record in records)
    return [write_text_atomic(os.path.join(output_dir, "requests.jsonl"), requests),
            write_text_atomic(os.path.join(output_dir, "summary.md"), markdown_summary(header, row)),
            write_summary(output_dir, header, [row])]


# (header, metric key, format) per class table column.
MARKDOWN_COLUMNS = (
    ("requests", "requests", "{:.0f}"),
    ("failed", "failed", "{:.0f}"),
    ("throughput tok/s", "throughput_tok_s", "{:.1f}"),
    ("P50 e2e s", "e2e_p50_s", "{:.3f}"),
    ("P99 e2e s", "e2e_p99_s", "{:.3f}"),
    ("mean e2e s", "e2e_mean_s", "{:.3f}"),
    ("P50 TTFT s", "ttft_p50_s", "{:.3f}"),
    ("P99 TTFT s", "ttft_p99_s", "{:.3f}"),
    ("P50 TPOT s", "tpot_p50_s", "{:.4f}"),
    ("P99 TPOT s", "tpot_p99_s", "{:.4f}"),
    ("P50 ITL s", "itl_p50_s", "{:.4f}"),
    ("P99 ITL s", "itl_p99_s", "{:.4f}"),
)


SGLANG_SUMMARY_KEYS = ("completed", "total_input_tokens", "input_throughput", "output_throughput", "total_throughput",
                       "max_concurrent_requests", "median_e2e_latency_ms", "p99_e2e_latency_ms", "median_ttft_ms",
                       "p99_ttft_ms", "median_tpot_ms", "p99_itl_ms", "request_goodput")


def markdown_summary(header: Dict, row: Dict) -> str:
    from specforge_outlets.serving.metrics import CLASSES, format_metric, pipe_table

    metrics = row["metrics"]
    lines = [f"# Serving benchmark: {row['label']}", ""]
    lines += [f"- {key}: {value}" for key, value in header.items()]
    lines += [f"- offered_rps: {row['offered_rps']:g}", ""]
    lines.append(pipe_table(
        ["class"] + [column[0] for column in MARKDOWN_COLUMNS],
        ([name] + [format_metric(metrics[name].get(key), fmt) for _, key, fmt in MARKDOWN_COLUMNS] for name in CLASSES),
    ))
    failed = metrics["all"]["failed"]
    lines += ["", "sglang.benchmark.serving's keys (successful requests only, as it computes them): "
              + ", ".join(f"{key} {format_metric(row.get(key), '{:.2f}')}" for key in SGLANG_SUMMARY_KEYS if key in row)]
    lines.append("")
    if failed:
        lines.append(f"**{failed} of {metrics['all']['requests']} requests failed**; a failed request counts as an "
                     "infinite latency (`inf`), so percentiles it reaches read `inf`. Errors: requests.jsonl.")
    lines.append(f"Short: fewer than {header['short_threshold']} generated tokens (a failed request: its expected "
                 "length). Queueing delay is not observable from the client and is not reported.")
    return "\n".join(lines) + "\n"
