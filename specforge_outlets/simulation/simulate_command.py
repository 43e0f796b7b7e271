"""``outlets simulate``: trace-driven simulation of a serving cluster under every scheduling policy."""

from __future__ import annotations

import dataclasses
import os

from specforge_outlets import wandb_report
from specforge_outlets.errors import OutletsError

# A directory holding either is an earlier run's report, which a new run replaces whole.
REPORT_FILES = ("summary.json", "summary.md")


def register(subparsers) -> None:
    from specforge_outlets.scheduling.keys import (
        DEFAULT_AGING_TOKENS_PER_S, DEFAULT_FOOTPRINT_CONTEXT_TOKENS, DEFAULT_LONG_HOLDBACK, DEFAULT_LONG_OUTPUT_LEN,
        DEFAULT_LONG_CLASS_SHARE, DEFAULT_MAX_RETRACTIONS, DEFAULT_PRIOR_OUTPUT_LEN, DEFAULT_RANK_WINDOW, DEFAULT_RISK_BETA,
        OrderKey,
    )
    from specforge_outlets.scheduling import PLUGIN_ROUTING, RoutingPolicy
    from specforge_outlets.simulation.sglang_peers import routing_names, routing_policy

    parser = subparsers.add_parser(
        "simulate",
        help="simulate a serving cluster on a trace under routing x queue-order policies",
        description=(
            "Discrete-event simulation of LLM serving (disaggregated prefill/decode or colocated) driven by a "
            "trace. Sweeps load, runs every routing x queue-order combination and the controlled study "
            "(SJF fixed, predictor varied), and writes summary.json, summary.md and PNG plots."
        ),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", help="Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens) or JSONL "
                                        "(timestamp,input_length,output_length[,id])")
    source.add_argument("--poisson-rate", type=float, help="synthetic Poisson arrivals at this many requests/s, "
                                                           "lengths drawn from --lengths-from")
    parser.add_argument("--lengths-from", help="trace, or lengths-only CSV (num_prefill_tokens,num_decode_tokens), "
                                              "whose (input, output) lengths a Poisson trace draws")
    parser.add_argument("--num-requests", type=int, default=None,
                        help="Poisson: number of requests (default 10000); trace: keep only the first N")
    parser.add_argument("--config", required=True, help="cluster YAML (see recipes/cluster-*.yaml)")
    parser.add_argument("--output", required=True, help="directory for summary.json, summary.md and plots")
    parser.add_argument("--rate-scale", type=float, nargs="+", default=[1.0],
                        help="arrival-rate multipliers to sweep (default 1)")
    parser.add_argument("--routing", nargs="+", default=["round-robin", "least-requests", PLUGIN_ROUTING.value],
                        choices=routing_names(),
                        help=f"routing: the plugin's ({PLUGIN_ROUTING.value}, the default's last), least-predicted-work "
                             "(a rule for studies), and for comparison SGLang's total-tokens balancing and "
                             "sglang-router's power-of-two (two random instances, loads polled every "
                             "load_poll_interval_s of --config, draws seeded by --seed); SGLang's "
                             "--load-balance-method and sglang-router's --policy names are taken too (round_robin, "
                             "total_requests, total_tokens, outlets, power_of_two)")
    parser.add_argument("--queue", nargs="+", default=["fcfs", "sjf", "tail-safe"],
                        choices=["fcfs", "sjf", "tail-safe", "tail-safe-ranks", "longest-predicted-first",
                                 "shortest-prefill-first", "lof", "hrrn"],
                        help="waiting-queue orders: the plugin's (tail-safe-ranks: tail-safe with the long class the "
                             "top --long-class-share of recent predictions; longest-predicted-first: for a batch's "
                             "makespan), and SGLang's shortest-prefill-first, lof and hrrn for comparison")
    parser.add_argument("--predictor", default="noisy", choices=["none", "oracle", "noisy", "file", "file-dynamic"],
                        help="predictor of the policy grid (default noisy; file-dynamic: the --predictions file's "
                             "per-token trajectories, re-predicted as tokens are generated)")
    parser.add_argument("--noise-sigma", type=float, default=0.5, help="noisy predictor: log-normal sigma")
    parser.add_argument("--predictions", help="JSONL of id, predicted_output_len[, true_output_len] for --predictor file, "
                                              "or outlets eval's predictions.jsonl.gz with --file-predictor")
    parser.add_argument("--file-predictor", metavar="NAME",
                        help="the predictor to read from a --predictions file of several (outlets eval's "
                             "predictions.jsonl.gz or predictions.jsonl), e.g. outlets or bert: its r0 for --predictor "
                             "file, its per-token trajectory for file-dynamic")
    parser.add_argument("--no-controlled-study", action="store_true",
                        help="skip the SJF-fixed, predictor-varied study")
    parser.add_argument("--study-routing", default=PLUGIN_ROUTING.value,
                        choices=[name for name in routing_names() if isinstance(routing_policy(name), RoutingPolicy)],
                        help=f"routing of the controlled study (default the plugin's, {PLUGIN_ROUTING.value})")
    parser.add_argument("--short-threshold", type=int, default=800, help="short requests: fewer output tokens")
    parser.add_argument("--goodput", nargs="+", metavar="METRIC:MS",
                        help="SLO targets in ms by sglang.benchmark.serving's --goodput names, e.g. ttft:500 tpot:50 e2el:9000 "
                        "(e2e is read as e2el): adds slo_attainment "
                        "and goodput_rps (requests within every target per second) per length class")
    parser.add_argument("--prior-output-len", type=float, default=DEFAULT_PRIOR_OUTPUT_LEN,
                        help="output length assumed for requests without a prediction")
    parser.add_argument("--aging-rate", type=float, default=DEFAULT_AGING_TOKENS_PER_S,
                        help="SJF aging: tokens of predicted length one second of waiting is worth (0: none)")
    parser.add_argument("--long-output-len", type=float, default=DEFAULT_LONG_OUTPUT_LEN,
                        help="tail-safe: predicted remaining length from which a request is in the long class")
    parser.add_argument("--long-holdback", type=float, default=DEFAULT_LONG_HOLDBACK,
                        help="tail-safe: share of its own wait within which later short requests may overtake a "
                             "predicted-long one (0: FCFS; starvation only at 1/holdback times overload)")
    parser.add_argument("--max-retractions", type=int, default=DEFAULT_MAX_RETRACTIONS,
                        help="kv_admission predicted: retract a request at most this often while others can go")
    parser.add_argument("--order-key", default=OrderKey.POINT.value, choices=[key.value for key in OrderKey],
                        help="what sjf orders by: point (the predicted remaining length, default), or the predicted "
                             "distribution's mean, risk (mean + --risk-beta x CVaR_0.9), gittins (its Gittins rank), "
                             "kv-footprint (E[(prompt + generated + R/2) R], the KV held over the decode); a request "
                             "without quantiles is a point mass at its prediction (noisy: a log-normal around it)")
    parser.add_argument("--risk-beta", type=float, default=DEFAULT_RISK_BETA,
                        help="--order-key risk: weight of CVaR_0.9 of the remaining length")
    parser.add_argument("--footprint-context", type=float, default=DEFAULT_FOOTPRINT_CONTEXT_TOKENS,
                        help="--order-key kv-footprint: KV tokens the footprint is divided by, so that it ages in "
                             "tokens (about the trace's mean prompt + half output)")
    parser.add_argument("--long-class-quantile", type=float, default=None, metavar="Q",
                        help="tail-safe: a request is long when the Q-quantile of its predicted remaining length "
                             "reaches --long-output-len (e.g. 0.9; default: by the point prediction)")
    parser.add_argument("--long-class-share", type=float, default=DEFAULT_LONG_CLASS_SHARE,
                        help="tail-safe-ranks: a request is long when its predicted remaining length is among this "
                             "top share of the last --rank-window predictions its instance's queue received")
    parser.add_argument("--rank-window", type=int, default=DEFAULT_RANK_WINDOW,
                        help="tail-safe-ranks: how many recent predictions the long class is read from")
    parser.add_argument("--seed", type=int, default=0)
    wandb_report.add_arguments(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from specforge_outlets.atomic import directory_replaced
    from specforge_outlets.evaluation.predictions_file import read_predictions
    from specforge_outlets.scheduling import SchedulingConfig
    from specforge_outlets.serving.summary import summary_rows_table
    from specforge_outlets.simulation.cluster import load_cluster_config
    from specforge_outlets.simulation.sglang_peers import queue_policy, routing_policy, routing_spelling
    from specforge_outlets.simulation.predicted_lengths import PredictorKind, read_file_quantiles
    from specforge_outlets.simulation.report import write_report
    from specforge_outlets.simulation.study import StudyPlan, policy_grid, run_study
    from specforge_outlets.serving.metrics import parse_goodput
    from specforge_outlets.serving.trace import load_lengths, load_trace, synthetic_poisson

    check_output(args.output)
    wandb_report.check_login(args)
    cluster = load_cluster_config(args.config)
    if args.poisson_rate is not None:
        if not args.lengths_from:
            raise OutletsError("--poisson-rate needs --lengths-from TRACE to draw request lengths from")
        trace = synthetic_poisson(load_lengths(args.lengths_from), args.poisson_rate, args.num_requests or 10000, args.seed)
    else:
        trace = load_trace(args.trace)
        if args.num_requests is not None:
            if args.num_requests < 1:
                raise OutletsError(f"--num-requests must be at least 1, got {args.num_requests}")
            trace = trace.head(args.num_requests)
    if args.file_predictor and not args.predictions:
        raise OutletsError(f"--file-predictor {args.file_predictor} names a predictor inside a --predictions file; "
                           "add --predictions FILE (e.g. outlets eval's predictions.jsonl.gz)")
    # a file with quantiles sets the levels the requests carry them at (noisy's too)
    file_levels = read_file_quantiles(args.predictions, args.file_predictor).levels if args.predictions else None
    try:
        scheduling = SchedulingConfig(args.prior_output_len, args.aging_rate, args.long_output_len, args.long_holdback,
                                      args.max_retractions, order_key=args.order_key, risk_beta=args.risk_beta,
                                      footprint_context_tokens=args.footprint_context,
                                      long_class_quantile=args.long_class_quantile,
                                      long_class_share=args.long_class_share, rank_window=args.rank_window,
                                      **({"quantile_levels": file_levels} if file_levels else {}))
    except ValueError as exc:
        raise OutletsError(f"scheduling settings: {exc}") from None
    if args.short_threshold < 1:
        raise OutletsError(f"--short-threshold must be at least 1, got {args.short_threshold}")
    predictor = PredictorKind(args.predictor)
    study_predictors = [] if args.no_controlled_study else [PredictorKind.NONE, PredictorKind.NOISY, PredictorKind.ORACLE]
    if args.predictions and not args.no_controlled_study:
        study_predictors.insert(2, PredictorKind.FILE)
        with_trajectory = {row.id for row in read_predictions(args.predictions, predictor=args.file_predictor)
                           if row.trajectory is not None}
        if all(request_id in with_trajectory for request_id in trace.ids):  # re-prediction against its static r̂_0
            study_predictors.insert(3, PredictorKind.FILE_DYNAMIC)
    routings = [routing_policy(name) for name in args.routing]
    plan = StudyPlan(
        rate_scales=args.rate_scale,
        policies=policy_grid(routings, [queue_policy(q) for q in args.queue]),
        predictor=predictor,
        study_predictors=study_predictors,
        study_routing=routing_policy(args.study_routing),
        noise_sigma=args.noise_sigma,
        predictions_path=args.predictions,
        short_threshold=args.short_threshold,
        seed=args.seed,
        slo=parse_goodput(args.goodput) or None,
        file_predictor=args.file_predictor,
    )
    print(f"simulate: {trace.name}, {len(trace)} requests over {trace.duration_s:.0f} s "
          f"({trace.offered_rps:.2f} req/s at x1), {cluster.mode.value} cluster")
    rows = run_study(trace, cluster, scheduling, plan, progress=print)
    header = {
        "trace": trace.name,
        "requests": len(trace),
        "trace_duration_s": trace.duration_s,
        "cluster": plain_fields(cluster),
        "kv_capacity_tokens_per_instance": cluster.kv_capacity(),
        "scheduling": plain_fields(scheduling),
        # the rows' routing names as SGLang's --load-balance-method and sglang-router's --policy say them (null: neither
        # serves it)
        "routing_in_sglang": {policy.value: routing_spelling(policy)
                              for policy in [*routings, plan.study_routing]},
        "noise_sigma": args.noise_sigma,
        "short_threshold": args.short_threshold,
        "slo_s": plan.slo,
        "seed": args.seed,
    }
    with directory_replaced(args.output) as scratch:  # interrupted: the earlier report stays whole, never mixed
        written = [os.path.join(args.output, os.path.relpath(path, scratch))
                   for path in write_report(scratch, header, rows)]
    for path in written:
        print(f"wrote {path}")
    wandb_report.log_run(args, "simulate", args.output, header, {"summary": summary_rows_table(rows)},
                         [path for path in written if path.endswith(".png")])
    return 0


def check_output(path: str) -> None:
    """``--output`` is a directory that the run replaces whole: refuse a file, and a directory of other files."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutletsError(f"--output {path} is a file; simulate writes a directory (summary.json, summary.md, "
                           "plots): name a new directory")
    if os.path.isdir(path) and os.listdir(path) and not any(os.path.isfile(os.path.join(path, name))
                                                            for name in REPORT_FILES):
        raise OutletsError(f"--output {path} holds other files than an earlier simulate report, and a run replaces "
                           "its directory whole; name a new or empty directory")


def plain_fields(config) -> dict:
    """A config dataclass's fields with enums as their values, as the summary prints and stores them."""
    return {key: getattr(value, "value", value) for key, value in dataclasses.asdict(config).items()}
