"""``outlets fit-step-time``: the simulator's step model fitted to a real SGLang server's log."""

from __future__ import annotations


def register(subparsers) -> None:
    from specforge_outlets.simulation.step_fit import DEFAULT_DECODE_LOG_INTERVAL

    parser = subparsers.add_parser(
        "fit-step-time",
        help="fit the simulator's step model to an SGLang server's log (fitted_step_time of a cluster YAML)",
        description=(
            "Reads the 'Decode batch' and 'Prefill batch' lines of SGLang server logs written under load, fits "
            "seconds per step = fixed + per running request + per KV token held + per prefilled token by "
            "non-negative least squares, and prints the fitted_step_time block of a cluster YAML (with "
            "kv_capacity_tokens: the server's --max-total-tokens) and how well it fits."
        ),
    )
    parser.add_argument("--server-log", nargs="+", required=True, help="SGLang server log file(s), each of a busy stretch")
    parser.add_argument("--decode-log-interval", type=int, default=DEFAULT_DECODE_LOG_INTERVAL,
                        help="the server's --decode-log-interval (decode steps between two decode lines)")
    parser.set_defaults(func=run)


def run(args) -> int:
    import os

    from specforge_outlets.errors import OutletsError
    from specforge_outlets.simulation.step_fit import fit_step_time, parse_intervals

    if args.decode_log_interval < 1:
        raise OutletsError(f"--decode-log-interval must be a positive integer, got {args.decode_log_interval}")
    intervals = []
    for path in args.server_log:
        if not os.path.isfile(path):
            raise OutletsError(f"--server-log {path}: no such file")
        with open(path, encoding="utf-8", errors="replace") as handle:
            found = parse_intervals(handle, args.decode_log_interval)
        if not found:
            raise OutletsError(f"--server-log {path}: no two 'Decode batch' lines; is it an SGLang server's log "
                               "written while it decoded?")
        intervals += found
    fit = fit_step_time(intervals)
    print("fitted_step_time:  # outlets fit-step-time " + " ".join(args.server_log))
    for key, value in fit.coefficients.items():
        print(f"  {key}: {value:.6g}")
    print(f"# {fit.intervals} intervals fitted ({fit.dropped} dropped as idle), R^2 {fit.r_squared:.3f}, "
          f"median error {fit.median_abs_error:.1%} per interval")
    return 0
