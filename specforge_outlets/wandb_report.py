"""``--report-to wandb``: the summary tables and plots of ``eval``, ``simulate`` and ``bench-serving``.

Training logs to wandb through SpecForge's tracker (the recipe's ``tracking:``); the later stages
write their results to files only, so a project's wandb workspace held SpecForge's half. With
``--report-to wandb`` each of these commands, once its files are written, opens one wandb run
(``job_type`` the command, named after its output directory, its settings as the run's config, files
under ``OUTPUT/wandb``) and logs its summary tables as ``wandb.Table`` and its plots as
``wandb.Image``. wandb's own environment applies: ``WANDB_MODE=offline`` (the tests), ``WANDB_API_KEY``.
"""

from __future__ import annotations

import glob
import netrc
import os
from typing import Any, Dict, List, Sequence, Tuple
from urllib.parse import urlparse

from specforge_outlets.errors import OutletsError
from specforge_outlets.strict_json import json_safe

Table = Tuple[List[str], List[List[Any]]]  # columns, rows
LOCAL_MODES = ("offline", "disabled", "dryrun")  # WANDB_MODE values that need no account
DEFAULT_HOST = "https://api.wandb.ai"  # wandb's server unless WANDB_BASE_URL names another


def add_arguments(parser) -> None:
    parser.add_argument("--report-to", choices=("none", "wandb"), default="none",
                        help="also log the summary tables and plots to wandb (one run; WANDB_MODE=offline for "
                             "no upload; files under OUTPUT/wandb)")
    parser.add_argument("--wandb-project", default="outlets", help="wandb project (default outlets)")


def has_login() -> bool:
    """Whether a wandb run can open without asking for a key: a local WANDB_MODE, WANDB_API_KEY, an identity
    token file, or the ``.netrc`` entry `wandb login` writes (the sources SpecForge's tracker reads too).
    Checked before a command runs: wandb would otherwise fail after the work is done, or wait for a key."""
    if os.environ.get("WANDB_MODE", "").lower() in LOCAL_MODES:
        return True
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or DEFAULT_HOST).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC") or None).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def check_login(args) -> None:
    """Refuse ``--report-to wandb`` without a wandb login, before the command does its work."""
    if getattr(args, "report_to", "none") == "wandb" and not has_login():
        raise OutletsError("--report-to wandb: wandb is not logged in (no WANDB_API_KEY, no ~/.netrc entry); "
                           "run `wandb login`, set WANDB_MODE=offline, or pass --report-to none")


def log_run(args, job_type: str, output_dir: str, config: Dict[str, Any], tables: Dict[str, Table],
            images: Sequence[str] = ()) -> None:
    """Log ``tables`` and ``images`` as one wandb run when ``--report-to wandb``; else nothing."""
    if getattr(args, "report_to", "none") != "wandb":
        return
    import wandb

    run = wandb.init(project=args.wandb_project, name=os.path.basename(os.path.normpath(output_dir)),
                     job_type=job_type, config=json_safe(config), dir=output_dir)
    try:
        logged = {name: wandb.Table(columns=columns, data=rows, allow_mixed_types=True)
                  for name, (columns, rows) in tables.items()}
        logged.update({os.path.splitext(os.path.basename(path))[0]: wandb.Image(path) for path in images})
        run.log(logged)
    finally:
        run.finish()
        wandb.teardown()  # wait for wandb's service to write the run out: the command's files are complete when it returns
    print(f"wandb: logged {', '.join(logged)} to project {args.wandb_project} ({job_type})")


def plots_in(directory: str) -> List[str]:
    """The PNG plots a command wrote into its output directory."""
    return sorted(glob.glob(os.path.join(directory, "*.png")))
