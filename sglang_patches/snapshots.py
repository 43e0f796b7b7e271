"""The plugin's load snapshot: SGLang's ``LoadSnapshot`` plus the rank's predicted work.

Written by each scheduler (``routing.get_loads_around``), read by the data-parallel controller
(``routing``) and by the HTTP process's ``GET /get_load`` (``load_endpoint``). msgspec structs decode
unknown fields away, so stock readers (``/v1/loads``) are unaffected; a reader that wants the extra
fields installs the subclass's decoder in its process (:func:`install_decoder`).
"""

from __future__ import annotations

from typing import Optional

from sglang_patches import state
from sglang_patches.settings import POLICY_NAME


def snapshot_class():
    """``LoadSnapshot`` with the plugin's fields (defined lazily: needs SGLang)."""
    if state.PLUGIN.snapshot_class is None:
        from sglang.srt.managers.load_snapshot import LoadSnapshot

        # None (the default, left out on the wire): the snapshot is SGLang's own, written by a
        # scheduler without an OUTLETS policy; readers then fall back to SGLang's figures.
        class OutletsLoadSnapshot(LoadSnapshot, omit_defaults=True):
            # predicted remaining output tokens of the rank's running, waiting and PD-queued requests
            outlets_predicted_work: Optional[float] = None
            outlets_num_requests: Optional[int] = None
            # generate requests this rank's scheduler has received since it started
            outlets_received_requests: Optional[int] = None

        state.PLUGIN.snapshot_class = OutletsLoadSnapshot
    return state.PLUGIN.snapshot_class


def install_decoder() -> None:
    """Make the load-snapshot readers of this process decode the plugin's fields."""
    import msgspec.msgpack
    from sglang.srt.managers import load_snapshot

    if getattr(load_snapshot.snapshot_decoder, "type", None) is not snapshot_class():
        load_snapshot.snapshot_decoder = msgspec.msgpack.Decoder(snapshot_class())


def install_snapshot_decoder() -> None:
    """The decoder, and ``outlets`` among SGLang's load-aware balancing methods (the DP controller's process)."""
    from sglang.srt.managers import load_snapshot

    install_decoder()
    if POLICY_NAME not in load_snapshot._LOAD_AWARE_METHODS:
        load_snapshot._LOAD_AWARE_METHODS = frozenset(load_snapshot._LOAD_AWARE_METHODS | {POLICY_NAME})
