"""``GET /get_load`` (sglang_patches/load_endpoint.py) on SGLang 0.5.23's own objects, in-process.

A real ``SchedulerLoadInquirer`` (its collaborators stood in) builds the snapshot through the applied
plugin hook, SGLang's shared-memory writer and reader carry it, and a FastAPI app serves the route.
The route on a real server: tests/test_sglang_server.py.
"""

from __future__ import annotations

import json
import math
import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("sglang", reason="SGLang tests run in the serve environment (make test)")

from sglang_patches import load_endpoint, predictions as P, state  # noqa: E402
from sglang_patches.snapshots import snapshot_class  # noqa: E402
from tests.sglang_harness.fixtures import no_outlets_settings, plugins_loaded  # noqa: F401  (fixtures)

PRIOR = 256.0


@pytest.fixture(autouse=True)
def no_lora(monkeypatch):
    """The load inquirer asks SGLang's runtime context about LoRA and the DP rank, published only inside a server."""
    from sglang.srt.managers.scheduler_components import load_inquirer

    monkeypatch.setattr(load_inquirer, "get_lora", lambda: SimpleNamespace(enable_lora=False))
    monkeypatch.setattr(load_inquirer, "get_parallel", lambda: SimpleNamespace(dp_rank=None))  # no DP controller


def outlets_policy(monkeypatch, on=True):
    monkeypatch.setattr(state, "schedule_policy_is_outlets", lambda: on)
    monkeypatch.setattr(state, "load_balance_is_outlets", lambda: False)


def sglang_req(rid, prompt_len, generated=0, predicted_output_len=None):
    """A real SGLang ``Req`` with the fields the load inquirer and the plugin read."""
    from sglang.srt.managers.schedule_batch import Req

    req = Req.__new__(Req)
    req.__dict__.update(rid=rid, origin_input_ids=[1] * prompt_len, output_ids=[2] * generated,
                        customized_info=None, sampling_params=SimpleNamespace(custom_params=None))
    if predicted_output_len is not None:
        P.set_predicted_output_len(req, predicted_output_len, "external")
    return req


def inquirer(running, waiting, used_tokens=0, mode=None):
    """SGLang's ``SchedulerLoadInquirer`` over the given queues (its other collaborators stood in)."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.scheduler_components.load_inquirer import SchedulerLoadInquirer

    stats = SimpleNamespace(cache_hit_rate=0.0, gen_throughput=0.0, kv_transfer_latency_ms=0.0,
                            kv_transfer_speed_gb_s=0.0, num_grammar_queue_reqs=0, num_paused_reqs=0,
                            num_retracted_reqs=0, spec_accept_rate=0.0, utilization=0.0)
    empty_queue = SimpleNamespace(queue=[], retracted_queue=[])
    pool = SimpleNamespace(get_pool_stats=lambda: SimpleNamespace(get_kv_token_stats=lambda: (used_tokens, 0.1)))
    return SchedulerLoadInquirer(
        disaggregation_mode=mode or DisaggregationMode.NULL, server_args=None, max_total_num_tokens=4096,
        max_running_requests=8, pool_stats_observer=pool, tp_worker=None, token_to_kv_pool_allocator=None,
        spec_algorithm=SimpleNamespace(is_none=lambda: True),
        get_running_batch=lambda: SimpleNamespace(reqs=running), get_waiting_queue=lambda: waiting,
        waiting_queue_prefix_matched=lambda: False, get_recent_cache_hit_rate=lambda: 0.0, get_stats=lambda: stats,
        get_chunked_req=lambda: None, get_disagg_prefill_bootstrap_queue=lambda: empty_queue,
        get_disagg_prefill_inflight_queue=lambda: [], get_disagg_decode_prealloc_queue=lambda: empty_queue,
        get_disagg_decode_transfer_queue=lambda: empty_queue, get_spec_total_num_accept_tokens=lambda: 0,
        get_spec_total_num_forward_ct=lambda: 0, get_total_prefill_uncached_tokens=lambda: 0,
        get_total_prefill_busy_us=lambda: 0, get_decode_moment_totals=lambda: (0, 0.0, 0.0))


def through_shared_memory(tmp_path, snapshots, dp_size):
    """The snapshots as the HTTP process reads them: SGLang's SHM writer per rank, its reader."""
    from sglang.srt.managers.load_snapshot import ShmLoadSnapshotReader, ShmLoadSnapshotWriter

    path = str(tmp_path / "loads.shm")
    writers = [ShmLoadSnapshotWriter(path, dp_size, snapshot.dp_rank) for snapshot in snapshots]
    for writer, snapshot in zip(writers, snapshots):
        writer.write(snapshot)
    return ShmLoadSnapshotReader(path, dp_size)


def queues():
    # running: predicted 500 with 100 generated (400 left), unknown (the prior, 256); waiting: predicted 50
    return ([sglang_req("a", 30, generated=100, predicted_output_len=500), sglang_req("b", 20)],
            [sglang_req("c", 40, predicted_output_len=50)])


def test_each_rank_reports_its_predicted_remaining_work_as_an_integer(plugins_loaded, monkeypatch, tmp_path):
    from sglang.srt.managers.load_snapshot import LoadSnapshot

    outlets_policy(monkeypatch)
    running, waiting = queues()
    snapshot = inquirer(running, waiting, used_tokens=150).get_loads()  # through the applied hook
    assert type(snapshot) is snapshot_class() and snapshot.outlets_predicted_work == 400 + PRIOR + 50
    stock_rank = LoadSnapshot(dp_rank=1, num_running_reqs=1, num_total_tokens=77)  # a rank without the plugin's field
    reader = through_shared_memory(tmp_path, [snapshot, stock_rank], dp_size=2)

    body = json.loads(json.dumps(load_endpoint.read_payload(reader)))  # as the router receives it
    assert [entry["dp_rank"] for entry in body] == [0, 1]
    assert body[0]["num_tokens"] == 706 and isinstance(body[0]["num_tokens"], int)
    assert body[0]["load"] == load_endpoint.PREDICTED and body[0]["num_reqs"] == 3 and body[0]["num_waiting_reqs"] == 1
    # the second rank's own token load; SGLang's for the first would have been 150 + 40 waiting
    assert body[1] == {"dp_rank": 1, "num_reqs": 1, "num_waiting_reqs": 0, "num_tokens": 77,
                       "load": load_endpoint.SGLANG_TOKENS}
    assert snapshot.num_total_tokens == 190


def test_without_an_outlets_policy_the_snapshot_is_sglangs_and_so_is_the_load(plugins_loaded, monkeypatch, tmp_path):
    outlets_policy(monkeypatch, on=False)
    running, waiting = queues()
    snapshot = inquirer(running, waiting, used_tokens=150).get_loads()
    assert not hasattr(snapshot, "outlets_predicted_work")
    body = load_endpoint.read_payload(through_shared_memory(tmp_path, [snapshot], dp_size=1))
    assert body[0]["num_tokens"] == 190 and body[0]["load"] == load_endpoint.SGLANG_TOKENS


def test_pd_decode_counts_queued_and_retracted_requests(plugins_loaded, monkeypatch):
    from sglang.srt.disaggregation.utils import DisaggregationMode

    outlets_policy(monkeypatch)
    running, waiting = queues()
    check = inquirer(running, waiting, mode=DisaggregationMode.DECODE)
    from sglang.srt.disaggregation.decode import DecodeRequest

    # SGLang's PD decode queues: waiting for KV slots, retracted (5 of 25 generated), KV in transfer
    prealloc = SimpleNamespace(queue=[DecodeRequest(req=sglang_req("d", 10, predicted_output_len=30), kv_receiver=None)],
                               retracted_queue=[sglang_req("e", 10, generated=5, predicted_output_len=25)])
    transfer = SimpleNamespace(queue=[DecodeRequest(req=sglang_req("f", 10, predicted_output_len=40), kv_receiver=None)])
    object.__setattr__(check, "get_disagg_decode_prealloc_queue", lambda: prealloc)
    object.__setattr__(check, "get_disagg_decode_transfer_queue", lambda: transfer)
    snapshot = check.get_loads()
    assert snapshot.outlets_predicted_work == 706 + 30 + 20 + 40 and snapshot.outlets_num_requests == 6
    assert load_endpoint.rank_entry(snapshot)["num_tokens"] == 796


def test_a_prefill_instance_reports_sglangs_token_load(plugins_loaded):
    from sglang.srt.managers.load_snapshot import DisaggregationMetrics

    snapshot = snapshot_class()(dp_rank=0, num_total_tokens=900, outlets_predicted_work=5000.0,
                                disaggregation=DisaggregationMetrics(mode="prefill"))
    assert load_endpoint.rank_entry(snapshot)["num_tokens"] == 900
    decode = snapshot_class()(dp_rank=0, num_total_tokens=900, outlets_predicted_work=5000.0,
                              disaggregation=DisaggregationMetrics(mode="decode"))
    assert load_endpoint.rank_entry(decode)["num_tokens"] == 5000


class BrokenReader:
    dp_size = 2

    def read_all(self):
        raise OSError("shared memory gone")


def test_it_never_fails_and_never_reports_minus_one(plugins_loaded):
    assert load_endpoint.read_payload(BrokenReader()) == [
        {"dp_rank": rank, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0, "load": load_endpoint.SGLANG_TOKENS}
        for rank in (0, 1)]
    bad_work = snapshot_class()(dp_rank=0, num_total_tokens=64, outlets_predicted_work=math.nan)
    unreadable = SimpleNamespace(dp_rank=1, num_total_tokens=12, num_running_reqs="many")  # int() raises
    body = load_endpoint.payload([bad_work, unreadable], num_ranks=3)
    assert [entry["num_tokens"] for entry in body] == [64, 12, 0]  # SGLang's loads; rank 2 not published yet
    assert all(entry["num_tokens"] >= 0 for entry in body)


def test_the_route_on_a_fastapi_app(plugins_loaded, monkeypatch, tmp_path):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    outlets_policy(monkeypatch)
    running, waiting = queues()
    reader = through_shared_memory(tmp_path, [inquirer(running, waiting).get_loads()], dp_size=1)
    app = FastAPI()
    assert load_endpoint.install_route(app, reader)
    assert not load_endpoint.install_route(app, reader)  # once
    client = TestClient(app)
    response = client.get("/get_load")
    assert response.status_code == 200 and response.json()[0]["num_tokens"] == 706

    broken = FastAPI()
    load_endpoint.install_route(broken, BrokenReader())
    response = TestClient(broken).get("/get_load")
    assert response.status_code == 200 and [e["num_tokens"] for e in response.json()] == [0, 0]


@pytest.mark.parametrize("outlets", [True, False])
def test_the_http_process_serves_the_route_only_under_an_outlets_policy(plugins_loaded, monkeypatch, outlets):
    from fastapi import FastAPI

    outlets_policy(monkeypatch, on=outlets)
    app = FastAPI()
    monkeypatch.setitem(sys.modules, load_endpoint.HTTP_SERVER_MODULE, SimpleNamespace(app=app))
    tokenizer_manager = SimpleNamespace(load_snapshot_reader=BrokenReader())
    load_endpoint.tokenizer_manager_init_after(None, tokenizer_manager)
    assert any(route.path == "/get_load" for route in app.routes) is outlets
