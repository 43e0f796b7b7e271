"""Which OUTLETS feature reads each setting, and the refusal of settings that no feature of the server reads.

The plugin's hooks leave SGLang alone unless a feature is asked for (``--schedule-policy outlets``,
``--load-balance-method outlets``, ``--outlets-draft-path``), so ``--outlets-order sjf
--outlets-kv-admission predicted`` on a server without ``--schedule-policy outlets`` would run
SGLang's own policy, FCFS, and say nothing. Refused at start-up instead, naming each flag (and its
``OUTLETS_*`` variable, which carries it and may have been exported by hand) and the feature that
reads it. No documented use passes such a flag: a PD prefill instance in predictor-only mode takes
``--outlets-draft-path`` alone, its decode instances the scheduling flags with
``--schedule-policy outlets``. ``--outlets-draft-path`` is a feature of its own and never refused here.

Checked when the command line is parsed (``cli``). ``sglang.Engine(...)`` has no command line and
is not checked: its scheduler cannot tell for certain whether the data-parallel controller routes by
``outlets``.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, List, Mapping

from sglang_patches import state
from sglang_patches.settings import (
    ENV_AGING,
    ENV_KV_ADMISSION,
    ENV_KV_MARGIN,
    ENV_KV_QUANTILE,
    ENV_LONG_CLASS_QUANTILE,
    ENV_LONG_CLASS_SHARE,
    ENV_LONG_HOLDBACK,
    ENV_LONG_OUTPUT_LEN,
    ENV_MAX_RETRACTIONS,
    ENV_ORDER,
    ENV_ORDER_KEY,
    ENV_PRIOR,
    ENV_QUANTILE_LEVELS,
    ENV_RANK_WINDOW,
    FLAGS,
    OutletsSettingsError,
)

# The queue order, KV admission and retraction are the policy's own
POLICY_ONLY = frozenset({state.ORDERING})
# The prior is what the policy and the data-parallel router count for a request without a prediction
PRIOR_READERS = frozenset({state.ORDERING, state.ROUTING})
# A request's quantiles are checked, kept and sent on under any feature (a predictor-only PD prefill sends its
# draft's, at the levels this flag must then name)
QUANTILE_READERS = frozenset({state.ORDERING, state.ROUTING, state.PREDICTOR})

# Every setting's variable (but the draft path's, a feature itself) -> the features that read it
READERS: Dict[str, FrozenSet[str]] = {
    ENV_PRIOR: PRIOR_READERS,
    ENV_ORDER: POLICY_ONLY,
    ENV_LONG_OUTPUT_LEN: POLICY_ONLY,
    ENV_LONG_HOLDBACK: POLICY_ONLY,
    ENV_KV_ADMISSION: POLICY_ONLY,
    ENV_KV_MARGIN: POLICY_ONLY,
    ENV_MAX_RETRACTIONS: POLICY_ONLY,
    ENV_AGING: POLICY_ONLY,
    ENV_ORDER_KEY: POLICY_ONLY,
    ENV_LONG_CLASS_QUANTILE: POLICY_ONLY,
    ENV_KV_QUANTILE: POLICY_ONLY,
    ENV_LONG_CLASS_SHARE: POLICY_ONLY,
    ENV_RANK_WINDOW: POLICY_ONLY,
    ENV_QUANTILE_LEVELS: QUANTILE_READERS,
}


def unread_settings(env: Mapping[str, str], asked) -> List[str]:
    """``"--flag (VARIABLE) is read by FEATURE"`` for each setting given (a non-empty variable) that none of the
    ``asked`` features reads, in the order of ``--help``."""
    unread = []
    for flag, _, variable, _, _ in FLAGS:
        readers = READERS.get(variable)
        if readers is not None and (env.get(variable) or "").strip() and not readers & set(asked):
            unread.append(f"{flag} ({variable}) is read by {' or '.join(sorted(readers))}")
    return unread


def refuse_unread_settings(env: Mapping[str, str], asked) -> None:
    """OutletsSettingsError naming every given setting that the server's features do not read."""
    unread = unread_settings(env, asked)
    if unread:
        running = f"only {', '.join(sorted(asked))}" if asked else "no OUTLETS feature (stock SGLang)"
        raise OutletsSettingsError(
            f"{'; '.join(unread)}, but this server runs {running}, which would ignore "
            f"{'it' if len(unread) == 1 else 'them'} silently: add the feature named (e.g. --schedule-policy "
            "outlets), or leave the flag out (and unset the variable) for stock SGLang")
