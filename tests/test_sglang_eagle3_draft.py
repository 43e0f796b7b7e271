"""An `outlets export` loaded by SGLang 0.5.23 as an EAGLE-3 draft (``OutletsLlamaForCausalLMEagle3``,
sglang_patches/eagle3_draft.py), in-process on the CPU, without a server (serve environment).

SGLang's model-parallel state is initialised for world size 1 (gloo) and a ``ServerArgs`` is
published, as SGLang's own layer tests do (``sglang.test.layer_ut_utils.init_single_process_dist``).
Exports are tiny random ones written here with the exact key names `outlets export` writes; the
architecture is resolved from their config.json through SGLang's ModelRegistry after the plugin
loads, and weights go through SGLang's loader (``sglang.srt.model_loader.get_model``:
DefaultModelLoader, its safetensors iterator, the class's ``load_weights``). The reference is the
plain-PyTorch forward of the predictor-only mode (specforge_outlets/model/plain_draft.py).
"""

from __future__ import annotations

import json
import os
import socket
import types

import pytest

pytest.importorskip("sglang", reason="SGLang tests run in the serve environment (make test)")

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from specforge_outlets.model.plain_draft import OutletsLengthPredictor  # noqa: E402

ARCH = "OutletsLlamaForCausalLMEagle3"
H, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, DRAFT_VOCAB = 64, 4, 2, 16, 128, 256, 64
TOKENS = 9


# -- SGLang in-process, world size 1 ----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def sglang_cpu():
    from sglang.srt.distributed import parallel_state
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    publish(ServerArgs(model_path="dummy", device="cpu", attention_backend="torch_native"),
            role="test", ranks=SpawnRanks(world_rank=0))
    owns_world = not torch.distributed.is_initialized()
    if owns_world:
        parallel_state.init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo",
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
        )
    parallel_state.initialize_model_parallel(backend="gloo")
    load_plugins()  # the `sglang.srt.plugins` entry point: sglang_patches.load() registers the draft class
    yield
    parallel_state.destroy_model_parallel()
    if owns_world:
        parallel_state.destroy_distributed_environment()
    reset_context()


# -- tiny exports with the key names `outlets export` writes ----------------------------------------


def make_export(directory, *, gated=True, bucket_edges=None, drop=(), extra=None, seed=0, quantile_levels=None) -> str:
    os.makedirs(directory, exist_ok=True)
    widths = [H, H // 2, H // 4]
    config = {
        "architectures": [ARCH], "model_type": "llama", "hidden_size": H, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "intermediate_size": INTER,
        "num_hidden_layers": 1, "vocab_size": VOCAB, "draft_vocab_size": DRAFT_VOCAB, "rms_norm_eps": 1e-5,
        "hidden_act": "silu", "max_position_embeddings": 512, "rope_theta": 10000.0,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "tie_word_embeddings": False,
        "dtype": "float32", "attention_bias": False, "mlp_bias": False, "pad_token_id": 0,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
        "outlets_config": {"fusion_layers": [2, 3, 4], "gated_attention": gated, "head_widths": widths,
                           "head_input": "draft", "bucket_edges": bucket_edges},
    }
    if quantile_levels is not None:  # a quantile head (issue 27)
        config["outlets_config"]["quantile_levels"] = list(quantile_levels)
    with open(os.path.join(directory, "config.json"), "w") as handle:
        json.dump(config, handle, indent=2)
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.1):
        return torch.randn(*shape, generator=g) * scale

    hot = torch.randperm(VOCAB, generator=g)[:DRAFT_VOCAB].sort().values
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[hot] = True
    q, kv, two_h = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, 2 * H
    outputs = len(bucket_edges) + 1 if bucket_edges else 1
    weights = {
        "d2t": hot - torch.arange(DRAFT_VOCAB), "t2d": t2d,
        "fc.weight": rand(H, 3 * H), "lm_head.weight": rand(DRAFT_VOCAB, H), "norm.weight": 1 + rand(H),
        "midlayer.hidden_norm.weight": 1 + rand(H), "midlayer.input_layernorm.weight": 1 + rand(H),
        "midlayer.post_attention_layernorm.weight": 1 + rand(H),
        "midlayer.mlp.gate_proj.weight": rand(INTER, H), "midlayer.mlp.up_proj.weight": rand(INTER, H),
        "midlayer.mlp.down_proj.weight": rand(H, INTER),
        "midlayer.self_attn.q_proj.weight": rand(q, two_h), "midlayer.self_attn.k_proj.weight": rand(kv, two_h),
        "midlayer.self_attn.v_proj.weight": rand(kv, two_h), "midlayer.self_attn.o_proj.weight": rand(H, q),
        "length_head.mlp.0.weight": rand(widths[1], widths[0]), "length_head.mlp.0.bias": rand(widths[1]),
        "length_head.mlp.2.weight": rand(widths[2], widths[1]), "length_head.mlp.2.bias": rand(widths[2]),
        "length_head.mlp.4.weight": rand(outputs, widths[2], scale=0.5),
        "length_head.mlp.4.bias": rand(outputs) + 3.0,
    }
    if quantile_levels is not None:
        weights.update({
            "quantile_head.mlp.0.weight": rand(widths[1], widths[0]), "quantile_head.mlp.0.bias": rand(widths[1]),
            "quantile_head.mlp.2.weight": rand(widths[2], widths[1]), "quantile_head.mlp.2.bias": rand(widths[2]),
            "quantile_head.mlp.4.weight": rand(len(quantile_levels), widths[2], scale=0.5),
            "quantile_head.mlp.4.bias": rand(len(quantile_levels)) + 1.0,
        })
    if gated:
        # Large enough that the gate visibly changes the attention output.
        weights["midlayer.self_attn.gate_proj.weight"] = rand(q, two_h, scale=0.5)
        weights["midlayer.self_attn.gate_proj.bias"] = rand(q)
    weights.update(extra or {})
    for key in drop:
        weights.pop(key)
    save_file(weights, os.path.join(directory, "model.safetensors"))
    return directory


def edit_outlets_config(directory, **changes) -> None:
    """Change keys of an export's ``outlets_config`` in place (before SGLang first reads the directory: it caches)."""
    with open(os.path.join(directory, "config.json")) as handle:
        config = json.load(handle)
    config["outlets_config"].update(changes)
    with open(os.path.join(directory, "config.json"), "w") as handle:
        json.dump(config, handle)


def load_with_sglang(directory):
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import get_model

    model_config = ModelConfig(directory, is_draft_model=True, dtype="float32")
    return get_model(model_config=model_config, load_config=LoadConfig(), device_config=DeviceConfig("cpu"))


def file_tensors(directory):
    from safetensors.torch import load_file

    return load_file(os.path.join(directory, "model.safetensors"))


def sglang_draft_forward(model, input_ids, fused):
    """One extend pass of the draft through SGLang's own layers and torch_native attention backend
    (KV written to and read from SGLang's MHA KV pool). Returns the normed state the LM head reads and
    the state the EAGLE worker keeps (before the final norm)."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    n = input_ids.shape[0]
    req_pool = ReqToTokenPool(size=2, max_context_len=64, device="cpu", enable_memory_saver=False)
    kv_pool = MHATokenToKVPool(size=64, page_size=1, dtype=torch.float32, head_num=KV_HEADS, head_dim=HEAD_DIM,
                               layer_num=1, device="cpu", enable_memory_saver=False)
    backend = TorchNativeAttnBackend(types.SimpleNamespace(device="cpu", req_to_token_pool=req_pool,
                                                           token_to_kv_pool=kv_pool))
    cache_loc = torch.arange(1, n + 1, dtype=torch.int64)
    req_pool.req_to_token[1, :n] = cache_loc.to(torch.int32)
    positions = torch.arange(n)
    batch = ForwardBatch(
        forward_mode=ForwardMode.EXTEND, batch_size=1, input_ids=input_ids, req_pool_indices=torch.tensor([1]),
        seq_lens=torch.tensor([n]), out_cache_loc=cache_loc, seq_lens_sum=n, positions=positions,
        extend_prefix_lens=torch.tensor([0]), extend_seq_lens=torch.tensor([n]),
        spec_info=types.SimpleNamespace(hidden_states=fused),  # the fused target features [n, 3H]
    )
    backend.init_forward_metadata(batch)
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=backend)):
        normed, (kept,) = model.model(input_ids, positions, batch)
    return normed, kept


def rms_norm(x, weight, eps=1e-5):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


# -- tests -------------------------------------------------------------------------------------------


def test_the_plugin_registers_the_architecture_with_sglangs_model_registry(sglang_cpu, tmp_path):
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
    from sglang.srt.models.registry import ModelRegistry

    from sglang_patches.eagle3_draft import OutletsLlamaForCausalLMEagle3

    with open(os.path.join(make_export(tmp_path / "draft"), "config.json")) as handle:
        architectures = json.load(handle)["architectures"]
    cls, arch = ModelRegistry.resolve_model_cls(architectures)
    assert (cls, arch) == (OutletsLlamaForCausalLMEagle3, ARCH)
    assert issubclass(cls, LlamaForCausalLMEagle3)


def test_sglangs_loader_loads_every_tensor_of_the_export(sglang_cpu, tmp_path):
    directory = make_export(tmp_path / "draft")
    model = load_with_sglang(directory)
    assert type(model).__name__ == ARCH
    params = dict(model.named_parameters())
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    fused_rows = {  # SGLang stacks q/k/v and gate/up into one parameter each
        "self_attn.q_proj": ("self_attn.qkv_proj", 0, q), "self_attn.k_proj": ("self_attn.qkv_proj", q, q + kv),
        "self_attn.v_proj": ("self_attn.qkv_proj", q + kv, q + 2 * kv),
        "mlp.gate_proj": ("mlp.gate_up_proj", 0, INTER), "mlp.up_proj": ("mlp.gate_up_proj", INTER, 2 * INTER),
    }
    covered = set()
    tensors = file_tensors(directory)
    for name, tensor in tensors.items():
        if name == "d2t":  # SGLang keeps the hot target ids (d2t holds target id - draft id)
            assert torch.equal(model.get_hot_token_id(), tensor + torch.arange(DRAFT_VOCAB))
            continue
        if name == "t2d":  # the inverse map of d2t; SGLang's EAGLE-3 loader does not use it
            assert tensor[model.get_hot_token_id()].all() and int(tensor.sum()) == DRAFT_VOCAB
            continue
        if name.startswith("length_head.") or name == "lm_head.weight":
            target, rows = name, None
        else:
            target, rows = "model." + name.replace("midlayer.", "layers.0."), None
            for part, (stacked, start, end) in fused_rows.items():
                if f".{part}." in target:
                    target, rows = target.replace(part, stacked), (start, end)
        value = params[target].detach()
        if rows is not None:
            value = value[rows[0]:rows[1]]
        assert torch.equal(value, tensor), name
        covered.add(target)
    # Every parameter of the draft came from the file, except the embedding (the target's, as in SGLang).
    assert set(params) - covered == {"model.embed_tokens.weight"}
    assert "model.layers.0.self_attn.gate_proj.weight" in covered and "length_head.mlp.4.bias" in covered


@pytest.mark.parametrize("bucket_edges", [None, [4, 16, 64, 256]], ids=["regression", "buckets"])
def test_length_head_equals_the_plain_pytorch_head(sglang_cpu, tmp_path, bucket_edges):
    directory = make_export(tmp_path / "draft", bucket_edges=bucket_edges)
    model = load_with_sglang(directory)
    reference = OutletsLengthPredictor(directory, torch.nn.Embedding(VOCAB, H))
    states = torch.randn(TOKENS, H, generator=torch.Generator().manual_seed(1))
    normed = model.model.norm(states)  # SGLang's RMSNorm with the export's norm.weight
    with torch.no_grad():
        z = model.length_log_remaining(normed)
    assert z.shape == (TOKENS,)
    torch.testing.assert_close(z, reference.log_remaining(states), rtol=0, atol=1e-5)  # norm + head
    reference.norm_output = False  # the head alone, on a random normed state
    torch.testing.assert_close(z, reference.log_remaining(normed), rtol=0, atol=1e-5)
    assert z.std() > 0


def test_gated_draft_forward_through_sglang_attention_matches_plain_pytorch(sglang_cpu, tmp_path):
    directory = make_export(tmp_path / "draft")
    model = load_with_sglang(directory)
    g = torch.Generator().manual_seed(2)
    embedding = torch.randn(VOCAB, H, generator=g) * 0.1
    model.model.embed_tokens.weight.data.copy_(embedding)  # SGLang's EAGLE worker shares the target's
    input_ids = torch.randint(0, VOCAB, (TOKENS,), generator=g)
    fused = torch.randn(TOKENS, 3 * H, generator=g)

    normed, kept = sglang_draft_forward(model, input_ids, fused)
    with torch.no_grad():
        z = model.length_log_remaining(normed)
        from_kept = model.log_remaining_from_draft_state(kept)  # EAGLE-3 mode: the worker's recurrent state

    reference = OutletsLengthPredictor(directory, torch.nn.Embedding.from_pretrained(embedding))
    states = reference.states(fused, input_ids)  # position j embeds the token at j (the next token)
    torch.testing.assert_close(normed, rms_norm(states, reference.w["norm.weight"]), rtol=0, atol=2e-5)
    torch.testing.assert_close(z, reference.log_remaining(states), rtol=0, atol=2e-5)
    torch.testing.assert_close(from_kept, z, rtol=0, atol=1e-6)
    assert (kept - normed).abs().max() > 1e-2  # the kept state is not the normed one
    # The gate is really applied: without it the same weights give another state.
    reference.gated = False
    ungated = rms_norm(reference.states(fused, input_ids), reference.w["norm.weight"])
    assert (normed - ungated).abs().max() > 1e-2


def test_eagle3_mode_refuses_a_head_trained_on_the_fused_features(sglang_cpu, tmp_path):
    directory = make_export(tmp_path / "draft")
    edit_outlets_config(directory, head_input="fused")
    from sglang_patches.eagle3_draft import OutletsDraftError

    with pytest.raises(OutletsDraftError, match="head_input='fused'.*predictor-only mode"):
        load_with_sglang(directory).require_draft_state_head()
    load_with_sglang(make_export(tmp_path / "draft-state")).require_draft_state_head()


def test_sglang_refuses_to_load_a_last_layer_draft_in_any_mode(sglang_cpu, tmp_path):
    """SGLang feeds the fused depths, which a last-layer draft's fc never trained on: refused at load, plugin or not."""
    directory = make_export(tmp_path / "draft")
    edit_outlets_config(directory, target_features="last_layer")
    from sglang_patches.eagle3_draft import OutletsDraftError

    with pytest.raises(OutletsDraftError, match="target_features='last_layer' is the training ablation"):
        load_with_sglang(directory)


def test_ungated_export_has_no_gate(sglang_cpu, tmp_path):
    directory = make_export(tmp_path / "draft", gated=False)
    model = load_with_sglang(directory)
    attention = model.model.layers[0].self_attn
    assert not hasattr(attention, "gate_proj")
    assert not attention._forward_pre_hooks and not attention.o_proj._forward_pre_hooks
    assert not any("gate_proj" in name and "self_attn" in name for name, _ in model.named_parameters())
    g = torch.Generator().manual_seed(3)
    embedding = torch.randn(VOCAB, H, generator=g) * 0.1
    model.model.embed_tokens.weight.data.copy_(embedding)
    input_ids = torch.randint(0, VOCAB, (TOKENS,), generator=g)
    fused = torch.randn(TOKENS, 3 * H, generator=g)
    normed, _ = sglang_draft_forward(model, input_ids, fused)
    reference = OutletsLengthPredictor(directory, torch.nn.Embedding.from_pretrained(embedding))
    assert not reference.gated
    states = reference.states(fused, input_ids)
    torch.testing.assert_close(normed, rms_norm(states, reference.w["norm.weight"]), rtol=0, atol=2e-5)


def test_predictor_runs_on_the_device_of_the_target_s_embedding(sglang_cpu, tmp_path):
    """Every tensor the predictor makes or reads lives where the target's embedding is, here torch's meta device.

    On a GPU server the target's embedding and captured features are on the GPU; a predictor with
    weights, masks or positions on the host would raise there (and fall back to the prior for every
    request), and raises here too.
    """
    directory = make_export(tmp_path / "draft", bucket_edges=[4, 16, 64, 256])
    predictor = OutletsLengthPredictor(directory, torch.nn.Embedding(VOCAB, H, device="meta"))
    assert {tensor.device.type for tensor in predictor.w.values()} == {"meta"}
    fused = torch.empty(TOKENS, 3 * H, device="meta")
    z = predictor.prompt_log_remaining(fused, list(range(TOKENS)), torch.tensor(3, device="meta"))
    assert z.device.type == "meta" and z.shape == ()
    host = OutletsLengthPredictor(directory, torch.nn.Embedding(VOCAB, H))  # the draft on the host ...
    with pytest.raises((RuntimeError, NotImplementedError)):  # ... cannot read features that live elsewhere
        host.states(fused, torch.zeros(TOKENS, dtype=torch.long, device="meta"))


@pytest.mark.parametrize("bucket_edges", [None, [4, 16, 64, 256]], ids=["regression", "buckets"])
def test_eagle3_mode_reads_the_head_where_the_draft_runs_without_waiting_for_it(sglang_cpu, tmp_path, bucket_edges):
    """EAGLE-3 mode's step-side path on torch's meta device: the head read on the worker's states and
    the estimates handed to the step's result stay on the draft's device (the target's), and nothing
    in it waits for the device (a host read of a meta tensor raises). The host copy is SGLang's."""
    from types import SimpleNamespace

    from sglang_patches import speculative

    model = load_with_sglang(make_export(tmp_path / "draft", bucket_edges=bucket_edges)).to("meta")
    batch = SimpleNamespace(reqs=[object()] * 3)
    result = SimpleNamespace(next_draft_input=SimpleNamespace(hidden_states=torch.empty(3, H, device="meta")),
                             logits_output=SimpleNamespace(auxiliary_device_output=None))
    speculative.attach_estimates(model, batch, result)
    estimates = result.logits_output.auxiliary_device_output
    assert isinstance(estimates, speculative.DraftLengthEstimates)
    assert estimates.log_remaining.device.type == "meta" and estimates.log_remaining.shape == (3,)
    with pytest.raises((RuntimeError, NotImplementedError)):  # what a sync would do here
        estimates.log_remaining.tolist()


@pytest.mark.parametrize("case", ["no-length-head", "no-gate", "gate-but-ungated-config", "no-d2t"])
def test_malformed_export_is_refused_with_a_clear_error(sglang_cpu, tmp_path, case):
    from sglang_patches.eagle3_draft import OutletsDraftError

    if case == "no-length-head":
        head = [f"length_head.mlp.{i}.{kind}" for i in (0, 2, 4) for kind in ("weight", "bias")]
        directory = make_export(tmp_path / "draft", drop=head)
        expected = r"the export lacks \['length_head\.mlp\.0\.weight'.*re-export"
    elif case == "no-gate":
        directory = make_export(tmp_path / "draft", drop=["midlayer.self_attn.gate_proj.weight",
                                                          "midlayer.self_attn.gate_proj.bias"])
        expected = (r"the export lacks \['midlayer\.self_attn\.gate_proj\.weight', "
                    r"'midlayer\.self_attn\.gate_proj\.bias'\]")
    elif case == "no-d2t":  # a reduced draft vocabulary without its map would draft wrong tokens
        directory = make_export(tmp_path / "draft", drop=["d2t"])
        expected = r"the export lacks \['d2t'\]"
    else:
        gate = make_export(tmp_path / "gated")
        directory = make_export(tmp_path / "draft", gated=False, extra={
            k: v for k, v in file_tensors(gate).items() if "self_attn.gate_proj" in k})
        expected = r"weights hold midlayer\.self_attn\.gate_proj\.\w+ but outlets_config\.gated_attention is false"
    with pytest.raises(OutletsDraftError, match=expected):
        load_with_sglang(directory)


# -- the quantile head (issue 27) ---------------------------------------------------------------------

LEVELS = (0.1, 0.5, 0.9)


def test_the_quantile_head_loads_and_reads_the_draft_state_as_the_plain_pytorch_head(sglang_cpu, tmp_path):
    """EAGLE-3 mode's quantiles (SGLang's loader, the worker's kept state) equal predictor-only mode's."""
    directory = make_export(tmp_path / "draft", quantile_levels=LEVELS)
    model = load_with_sglang(directory)
    tensors = file_tensors(directory)
    for name, param in model.quantile_head.named_parameters():
        assert torch.equal(param.detach(), tensors[f"quantile_head.{name}"]), name
    reference = OutletsLengthPredictor(directory, torch.nn.Embedding(VOCAB, H))
    kept = torch.randn(TOKENS, H, generator=torch.Generator().manual_seed(4))  # before the final norm, as the worker keeps it
    with torch.no_grad():
        zq = model.log_remaining_quantiles_from_draft_state(kept)
    assert zq.shape == (TOKENS, len(LEVELS)) and bool((zq[:, 1:] >= zq[:, :-1]).all())
    torch.testing.assert_close(zq, reference.log_remaining_quantiles(kept), rtol=0, atol=1e-5)
    assert zq.std() > 0
    plain = load_with_sglang(make_export(tmp_path / "plain"))
    assert plain.quantile_head is None
    from sglang_patches.eagle3_draft import OutletsDraftError

    with pytest.raises(OutletsDraftError, match="no quantile head"):
        plain.log_remaining_quantiles_from_draft_state(kept)


def test_the_served_shifts_of_a_calibrated_export_are_added_in_both_modes(sglang_cpu, tmp_path):
    """outlets_config.quantile_shifts (fit-quantile-head --calibration-features): EAGLE-3 mode adds them as
    predictor-only mode does, keeping the quantiles non-decreasing."""
    kept = torch.randn(TOKENS, H, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():  # the same weights (seed 0) in two directories: SGLang caches a directory's config
        raw = load_with_sglang(make_export(tmp_path / "raw", quantile_levels=LEVELS)).log_remaining_quantiles_from_draft_state(kept)
    directory = make_export(tmp_path / "draft", quantile_levels=LEVELS)
    shifts = [0.5, -0.2, 0.1]  # the middle one drops below the lowest where the raw gap is small: cummax holds them
    edit_outlets_config(directory, quantile_shifts=shifts)
    with torch.no_grad():
        zq = load_with_sglang(directory).log_remaining_quantiles_from_draft_state(kept)
    expected = torch.cummax(raw + torch.tensor(shifts), dim=-1).values
    torch.testing.assert_close(zq, expected, rtol=0, atol=1e-5)
    reference = OutletsLengthPredictor(directory, torch.nn.Embedding(VOCAB, H))
    torch.testing.assert_close(zq, reference.log_remaining_quantiles(kept), rtol=0, atol=1e-5)


def test_quantile_head_weights_without_levels_or_levels_without_weights_are_refused(sglang_cpu, tmp_path):
    from sglang_patches.eagle3_draft import OutletsDraftError

    head = {k: v for k, v in file_tensors(make_export(tmp_path / "head", quantile_levels=LEVELS)).items()
            if k.startswith("quantile_head.")}
    with pytest.raises(OutletsDraftError, match=r"weights hold quantile_head\.\S+ but outlets_config has no quantile_levels"):
        load_with_sglang(make_export(tmp_path / "no-levels", extra=head))
    with pytest.raises(OutletsDraftError, match=r"the export lacks \['quantile_head\.mlp\.0\.weight'"):
        load_with_sglang(make_export(tmp_path / "no-weights", quantile_levels=LEVELS, drop=list(head)))


def test_eagle3_mode_hands_the_quantiles_to_the_step_without_waiting_for_them(sglang_cpu, tmp_path):
    from types import SimpleNamespace

    from sglang_patches import speculative

    model = load_with_sglang(make_export(tmp_path / "draft", quantile_levels=LEVELS)).to("meta")
    result = SimpleNamespace(next_draft_input=SimpleNamespace(hidden_states=torch.empty(3, H, device="meta")),
                             logits_output=SimpleNamespace(auxiliary_device_output=None))
    speculative.attach_estimates(model, SimpleNamespace(reqs=[object()] * 3), result)
    estimates = result.logits_output.auxiliary_device_output
    assert estimates.log_quantiles.device.type == "meta" and estimates.log_quantiles.shape == (3, len(LEVELS))


def test_predictor_only_mode_reads_both_heads_on_the_state_of_the_last_prompt_position(sglang_cpu, tmp_path,
                                                                                      monkeypatch):
    from sglang_patches import predictor_mode, state

    g = torch.Generator().manual_seed(5)
    embedding = torch.nn.Embedding.from_pretrained(torch.randn(VOCAB, H, generator=g) * 0.1)
    fused, prompt = torch.randn(TOKENS, 3 * H, generator=g), list(range(10, 10 + TOKENS))
    head = OutletsLengthPredictor(make_export(tmp_path / "head", quantile_levels=LEVELS), embedding)
    monkeypatch.setattr(state.PLUGIN, "predictor", head)
    outputs = predictor_mode.prompt_outputs(fused, prompt, torch.tensor(7))
    states = head.states(fused, torch.tensor(prompt[1:] + [7]))
    assert outputs.shape == (1 + len(LEVELS),)
    torch.testing.assert_close(outputs[0], head.prompt_log_remaining(fused, prompt, torch.tensor(7)), rtol=0, atol=1e-5)
    torch.testing.assert_close(outputs[1:], head.log_remaining_quantiles(states)[-1], rtol=0, atol=1e-5)
    plain = OutletsLengthPredictor(make_export(tmp_path / "plain"), embedding)
    monkeypatch.setattr(state.PLUGIN, "predictor", plain)  # without a quantile head: r̂_0 alone, as before
    assert predictor_mode.prompt_outputs(fused, prompt, torch.tensor(7)).shape == ()
