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


class PagedDecode:
    """Decode steps through cinfer.BatchDecodeWithPagedKVCacheWrapper: each call copies the
    layer's cached K/V (transformers' contiguous [batch, Hk, kv_len, D]) into a paged cache of
    16-token pages with a scattered page table, plans the step and runs it, as an engine would."""

    page = 16

    def __init__(self):
        self.wrapper = cinfer.BatchDecodeWithPagedKVCacheWrapper(
            torch.empty(64 << 20, dtype=torch.uint8, device=DEV), "NHD")
        self.calls = 0

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                 **kwargs):
        assert attention_mask is None and dropout == 0.0 and query.shape[2] == 1
        batch, hq, _, d = query.shape
        hk, kv_len = key.shape[1], key.shape[2]
        pages_per = (kv_len + self.page - 1) // self.page
        num_pages = batch * pages_per
        # Page i of the table is a scattered page of the pool.
        order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(kv_len))
        cache = torch.zeros(num_pages, 2, self.page, hk, d, dtype=key.dtype, device=DEV)
        for b in range(batch):
            for p in range(pages_per):
                lo, hi = p * self.page, min(kv_len, (p + 1) * self.page)
                slot = order[b * pages_per + p]
                cache[slot, 0, :hi - lo] = key[b, :, lo:hi].transpose(0, 1)
                cache[slot, 1, :hi - lo] = value[b, :, lo:hi].transpose(0, 1)
        indptr = torch.arange(0, num_pages + 1, pages_per, dtype=torch.int32, device=DEV)
        indices = order.to(torch.int32).to(DEV)
        last = torch.full((batch,), kv_len - (pages_per - 1) * self.page, dtype=torch.int32,
                          device=DEV)
        self.wrapper.plan(indptr, indices, last, hq, hk, d, self.page, q_data_type=query.dtype,
                          kv_data_type=key.dtype, sm_scale=scaling)
        out = self.wrapper.run(query[:, :, 0].contiguous(), cache)  # [batch, Hq, D]
        self.calls += 1
        return out[:, None], None


def test_llama_decode_steps_over_a_paged_cache():
    """Prefill through cinfer's single prefill, then 4 greedy decode steps whose attention runs
    through batch decode over a paged KV cache: the logits of every step match SDPA's."""
    decode = PagedDecode()

    def routed(module, query, key, value, attention_mask, **kwargs):
        if query.shape[2] == 1:
            return decode(module, query, key, value, attention_mask, **kwargs)
        return cinfer_attention(module, query, key, value, attention_mask, **kwargs)

    transformers.AttentionInterface.register("cinfer_paged", routed)
    sdpa = _model("sdpa")
    model = _model("cinfer_paged", sdpa.state_dict())
    prompt = torch.randint(0, 512, (3, 45), generator=torch.Generator().manual_seed(3)).to(DEV)
    with torch.no_grad():
        want = sdpa(prompt, use_cache=True)
        got = model(prompt, use_cache=True)
        _close(got.logits, want.logits)
        want_cache, got_cache = want.past_key_values, got.past_key_values
        token = want.logits[:, -1:].argmax(-1)
        for _ in range(4):
            want = sdpa(token, past_key_values=want_cache, use_cache=True)
            got = model(token, past_key_values=got_cache, use_cache=True)
            _close(got.logits, want.logits)
            want_cache, got_cache = want.past_key_values, got.past_key_values
            token = want.logits[:, -1:].argmax(-1)
    assert decode.calls == 4 * 2  # four steps, two layers
