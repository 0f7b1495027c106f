"""A real client: a small Llama from Hugging Face transformers (random weights, 32 query and 8 KV
heads of head dim 128, 2 layers) whose attention is routed through
cinfer.single_prefill_with_kv_cache, one request at a time, by a function registered with
transformers' AttentionInterface. Its logits must equal the SDPA path's, for a prompt and for a
next step that attends to the KV cache. Skipped without transformers or a CUDA device."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
if not hasattr(transformers, "AttentionInterface"):
    pytest.skip("transformers without AttentionInterface (needs 4.48 or later)",
                allow_module_level=True)

import cinfer  # noqa: E402

DEV = "cuda"
calls = []


def cinfer_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                     **kwargs):
    """transformers' attention-function contract: query [batch, Hq, q_len, D], key and value
    [batch, Hk, kv_len, D] (KV heads not repeated); returns ([batch, q_len, Hq, D], weights)."""
    # A registered function that has no mask function of its own gets no mask: causal
    # attention over requests without padding, which is what this test feeds.
    assert attention_mask is None and dropout == 0.0
    out = []
    for b in range(query.shape[0]):
        # q as [q_len, Hq, D] (a strided view); key[b] is already the HND layout.
        out.append(cinfer.single_prefill_with_kv_cache(
            query[b].transpose(0, 1), key[b], value[b], causal=module.is_causal,
            kv_layout="HND", sm_scale=scaling))
    calls.append((tuple(query.shape), tuple(key.shape)))
    return torch.stack(out), None


def _model(attn_implementation, state=None):
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=4096)
    config._attn_implementation = attn_implementation
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(device=DEV, dtype=torch.float16).eval()
    if state is not None:
        model.load_state_dict(state)
    return model


def _close(got, want):
    """Normalized max error: the two paths round attention outputs differently (fp16)."""
    err = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item()
    assert err <= 1e-2 * scale, f"max |cinfer - sdpa| = {err}, max |sdpa| = {scale}"


def test_llama_logits_match_sdpa():
    transformers.AttentionInterface.register("cinfer", cinfer_attention)
    sdpa = _model("sdpa")
    model = _model("cinfer", sdpa.state_dict())
    prompt = torch.randint(0, 512, (2, 300), generator=torch.Generator().manual_seed(1)).to(DEV)
    step = torch.randint(0, 512, (2, 3), generator=torch.Generator().manual_seed(2)).to(DEV)
    calls.clear()
    with torch.no_grad():
        want = sdpa(prompt, use_cache=True)
        got = model(prompt, use_cache=True)
        assert calls and calls[0] == ((2, 32, 300, 128), (2, 8, 300, 128))
        _close(got.logits, want.logits)
        # The next 3 tokens attend to the cached 300 (qo_len 3 over kv_len 303, bottom-right
        # causal).
        want2 = sdpa(step, past_key_values=want.past_key_values, use_cache=True)
        calls.clear()
        got2 = model(step, past_key_values=got.past_key_values, use_cache=True)
        assert calls[0] == ((2, 32, 3, 128), (2, 8, 303, 128))
        _close(got2.logits, want2.logits)
    assert got.logits.argmax(-1).eq(want.logits.argmax(-1)).float().mean() > 0.99
