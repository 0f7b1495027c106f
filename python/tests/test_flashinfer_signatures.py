"""The public API's parameter lists against FlashInfer 0.2's, without torch or a GPU: names, their
positional order, defaults and which ones are keyword-only, so that a call written for FlashInfer
binds every argument to the same parameter in cinfer (``import cinfer as flashinfer``).

The reference lists are FlashInfer 0.2.14's (its last 0.2 release, a superset of 0.2.5's), with
one exception: single prefill keeps 0.2.0-0.2.7's order, since 0.2.8 moved its positional
parameters (``scale_q`` .. ``o_dtype`` after ``v``, ``backend`` before ``return_lse``), so no order
suits both; cinfer takes the 0.2.8 additions by keyword. cinfer's own extensions come after the
reference parameters, where FlashInfer has no positional argument to give them.
"""

import ast
import inspect

import pytest

import cinfer

P = inspect.Parameter

# One entry per FlashInfer function or method: its parameters in order, "name" (required) or
# "name=default"; "*args" is FlashInfer's variadic parameter, after which everything is
# keyword-only (cinfer must then have the name keyword-only too, with the same default).
_DECODE_OPTIONS = ("window_left=-1 logits_soft_cap=None sm_scale=None rope_scale=None "
                   "rope_theta=None")
SIGNATURES = {
    "single_decode_with_kv_cache":
        "q k v kv_layout='NHD' pos_encoding_mode='NONE' use_tensor_cores=False q_scale=None "
        "k_scale=None v_scale=None " + _DECODE_OPTIONS + " return_lse=False",
    "single_prefill_with_kv_cache":
        "q k v custom_mask=None packed_custom_mask=None causal=False kv_layout='NHD' "
        "pos_encoding_mode='NONE' use_fp16_qk_reduction=False sm_scale=None window_left=-1 "
        "logits_soft_cap=None rope_scale=None rope_theta=None return_lse=False backend='auto'",
    "single_prefill_with_kv_cache_return_lse":
        "q k v custom_mask=None packed_custom_mask=None causal=False kv_layout='NHD' "
        "pos_encoding_mode='NONE' use_fp16_qk_reduction=False sm_scale=None window_left=-1 "
        "logits_soft_cap=None rope_scale=None rope_theta=None",
    "BatchDecodeWithPagedKVCacheWrapper.__init__":
        "float_workspace_buffer kv_layout='NHD' use_cuda_graph=False use_tensor_cores=False "
        "paged_kv_indptr_buffer=None paged_kv_indices_buffer=None "
        "paged_kv_last_page_len_buffer=None backend='auto' jit_args=None",
    "BatchDecodeWithPagedKVCacheWrapper.plan":
        "indptr indices last_page_len num_qo_heads num_kv_heads head_dim page_size "
        "pos_encoding_mode='NONE' window_left=-1 logits_soft_cap=None q_data_type='float16' "
        "kv_data_type=None data_type=None sm_scale=None rope_scale=None rope_theta=None "
        "non_blocking=True block_tables=None seq_lens=None",
    "BatchDecodeWithPagedKVCacheWrapper.run":
        "q paged_kv_cache *args q_scale=None k_scale=None v_scale=None out=None lse=None "
        "return_lse=False enable_pdl=None window_left=None sinks=None",
    "BatchDecodeWithPagedKVCacheWrapper.run_return_lse":
        "q paged_kv_cache *args q_scale=None k_scale=None v_scale=None out=None lse=None "
        "return_lse=True enable_pdl=None window_left=None sinks=None",
    "BatchDecodeWithPagedKVCacheWrapper.forward":
        "q paged_kv_cache pos_encoding_mode='NONE' q_scale=None k_scale=None v_scale=None "
        + _DECODE_OPTIONS,
    "BatchDecodeWithPagedKVCacheWrapper.forward_return_lse":
        "q paged_kv_cache pos_encoding_mode='NONE' q_scale=None k_scale=None v_scale=None "
        + _DECODE_OPTIONS,
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper.__init__":
        "workspace_buffer indptr_buffer indices_buffer last_page_len_buffer kv_layout='NHD' "
        "use_tensor_cores=False",
    "BatchPrefillWithPagedKVCacheWrapper.__init__":
        "float_workspace_buffer kv_layout='NHD' use_cuda_graph=False qo_indptr_buf=None "
        "paged_kv_indptr_buf=None paged_kv_indices_buf=None paged_kv_last_page_len_buf=None "
        "custom_mask_buf=None mask_indptr_buf=None backend='auto' jit_args=None jit_kwargs=None",
    "BatchPrefillWithPagedKVCacheWrapper.plan":
        "qo_indptr paged_kv_indptr paged_kv_indices paged_kv_last_page_len num_qo_heads "
        "num_kv_heads head_dim_qk page_size head_dim_vo=None custom_mask=None "
        "packed_custom_mask=None causal=False pos_encoding_mode='NONE' "
        "use_fp16_qk_reduction=False sm_scale=None window_left=-1 logits_soft_cap=None "
        "rope_scale=None rope_theta=None q_data_type='float16' kv_data_type=None "
        "non_blocking=True prefix_len_ptr=None token_pos_in_items_ptr=None "
        "token_pos_in_items_len=0 max_item_len_ptr=None seq_lens=None seq_lens_q=None "
        "block_tables=None max_token_per_sequence=None max_sequence_kv=None",
    "BatchPrefillWithPagedKVCacheWrapper.run":
        "q paged_kv_cache *args q_scale=None k_scale=None v_scale=None out=None lse=None "
        "return_lse=False enable_pdl=None window_left=None sinks=None",
    "BatchPrefillWithPagedKVCacheWrapper.forward":
        "q paged_kv_cache causal=False pos_encoding_mode='NONE' use_fp16_qk_reduction=False "
        "k_scale=None v_scale=None " + _DECODE_OPTIONS,
    "BatchPrefillWithRaggedKVCacheWrapper.__init__":
        "float_workspace_buffer kv_layout='NHD' use_cuda_graph=False qo_indptr_buf=None "
        "kv_indptr_buf=None custom_mask_buf=None mask_indptr_buf=None backend='auto' "
        "jit_args=None jit_kwargs=None",
    "BatchPrefillWithRaggedKVCacheWrapper.plan":
        "qo_indptr kv_indptr num_qo_heads num_kv_heads head_dim_qk head_dim_vo=None "
        "custom_mask=None packed_custom_mask=None causal=False pos_encoding_mode='NONE' "
        "use_fp16_qk_reduction=False window_left=-1 logits_soft_cap=None sm_scale=None "
        "rope_scale=None rope_theta=None q_data_type='float16' kv_data_type=None "
        "non_blocking=True prefix_len_ptr=None token_pos_in_items_ptr=None "
        "token_pos_in_items_len=0 max_item_len_ptr=None",
    "BatchPrefillWithRaggedKVCacheWrapper.run":
        "q k v *args out=None lse=None return_lse=False enable_pdl=None",
    "BatchPrefillWithRaggedKVCacheWrapper.forward":
        "q k v causal=False pos_encoding_mode='NONE' use_fp16_qk_reduction=False window_left=-1 "
        "logits_soft_cap=None sm_scale=None rope_scale=None rope_theta=None",
    "MultiLevelCascadeAttentionWrapper.__init__":
        "num_levels float_workspace_buffer kv_layout='NHD' use_cuda_graph=False "
        "qo_indptr_buf_arr=None paged_kv_indptr_buf_arr=None paged_kv_indices_buf_arr=None "
        "paged_kv_last_page_len_buf_arr=None",
    "MultiLevelCascadeAttentionWrapper.plan":
        "qo_indptr_arr paged_kv_indptr_arr paged_kv_indices_arr paged_kv_last_page_len "
        "num_qo_heads num_kv_heads head_dim page_size causal=False pos_encoding_mode='NONE' "
        "use_fp16_qk_reduction=False sm_scale=None window_left=-1 logits_soft_cap=None "
        "rope_scale=None rope_theta=None q_data_type='float16' kv_data_type=None",
    "MultiLevelCascadeAttentionWrapper.run": "q paged_kv_cache",
    "BatchMLAPagedAttentionWrapper.__init__":
        "float_workspace_buffer use_cuda_graph=False qo_indptr=None kv_indptr=None "
        "kv_indices=None kv_len_arr=None backend='auto'",
    "BatchMLAPagedAttentionWrapper.plan":
        "qo_indptr kv_indptr kv_indices kv_len_arr num_heads head_dim_ckv head_dim_kpe "
        "page_size causal sm_scale q_data_type kv_data_type use_profiler=False",
    "BatchMLAPagedAttentionWrapper.run":
        "q_nope q_pe ckv_cache kpe_cache out=None lse=None return_lse=False "
        "profiler_buffer=None kv_len=None page_table=None",
    "merge_state": "v_a s_a v_b s_b",
    "merge_state_in_place": "v s v_other s_other mask=None",
    "merge_states": "v s",
    "append_paged_kv_cache":
        "append_key append_value batch_indices positions paged_kv_cache kv_indices kv_indptr "
        "kv_last_page_len kv_layout='NHD'",
    "get_batch_indices_positions": "append_indptr seq_lens nnz",
    "get_seq_lens": "kv_indptr kv_last_page_len page_size",
    "packbits": "x bitorder='big'",
    "segment_packbits": "x indptr bitorder='big'",
    "apply_rope_with_cos_sin_cache":
        "positions query key head_size cos_sin_cache is_neox=True",
    "apply_rope_with_cos_sin_cache_inplace":
        "positions query key head_size cos_sin_cache is_neox=True",
}
for _name in ("apply_rope", "apply_rope_inplace"):
    SIGNATURES[_name] = ("q k indptr offsets rotary_dim=None interleave=False rope_scale=1 "
                         "rope_theta=10000.0")
for _name in ("apply_rope_pos_ids", "apply_rope_pos_ids_inplace"):
    SIGNATURES[_name] = ("q k pos_ids rotary_dim=None interleave=False rope_scale=1 "
                         "rope_theta=10000.0")
_LLAMA31 = ("rotary_dim=None interleave=False rope_scale=8 rope_theta=500000.0 "
            "low_freq_factor=1 high_freq_factor=4 old_context_len=8192")
for _name in ("apply_llama31_rope", "apply_llama31_rope_inplace"):
    SIGNATURES[_name] = "q k indptr offsets " + _LLAMA31
for _name in ("apply_llama31_rope_pos_ids", "apply_llama31_rope_pos_ids_inplace"):
    SIGNATURES[_name] = "q k pos_ids " + _LLAMA31
# The deprecated names are the same functions in FlashInfer.
for _cls in ("BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper",
             "BatchPrefillWithRaggedKVCacheWrapper", "MultiLevelCascadeAttentionWrapper"):
    SIGNATURES[f"{_cls}.begin_forward"] = SIGNATURES[f"{_cls}.plan"]
SIGNATURES["MultiLevelCascadeAttentionWrapper.forward"] = SIGNATURES[
    "MultiLevelCascadeAttentionWrapper.run"]
# The CUDA-graph decode wrapper inherits everything but __init__.
for _m in ("plan", "run", "run_return_lse", "forward", "forward_return_lse"):
    SIGNATURES[f"CUDAGraphBatchDecodeWithPagedKVCacheWrapper.{_m}"] = SIGNATURES[
        f"BatchDecodeWithPagedKVCacheWrapper.{_m}"]

# Keyword arguments of later FlashInfer 0.2 releases that cinfer takes by keyword only (their
# FlashInfer position contradicts the 0.2.0-0.2.7 order kept above).
KEYWORD_ONLY = {
    "single_prefill_with_kv_cache": "scale_q=None scale_k=None scale_v=None o_dtype=None",
    "single_prefill_with_kv_cache_return_lse":
        "scale_q=None scale_k=None scale_v=None o_dtype=None backend='auto' return_lse=True",
}


def _resolve(name):
    obj = cinfer
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _parse(spec):
    """[(name, default or P.empty, keyword_only, variadic)] of a spec string."""
    out, keyword_only = [], False
    for token in spec.split():
        if token == "*args":
            out.append(("args", P.empty, False, True))
            keyword_only = True
            continue
        name, eq, default = token.partition("=")
        out.append((name, ast.literal_eval(default) if eq else P.empty, keyword_only, False))
    return out


def _params(obj):
    params = list(inspect.signature(obj).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return params


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_positional_order_defaults_and_keyword_only(name):
    params = _params(_resolve(name))
    by_name = {p.name: p for p in params}
    expected = _parse(SIGNATURES[name])
    positional = [e for e in expected if not e[2]]
    # FlashInfer's positional parameters are cinfer's first ones, in the same order, so a
    # positional call binds every argument to the same name.
    got = [(p.name, p.kind) for p in params[:len(positional)]]
    want = [("args" if var else n, P.VAR_POSITIONAL if var else P.POSITIONAL_OR_KEYWORD)
            for n, _, _, var in positional]
    if got != want:
        pytest.fail(f"{name}: positional parameters {got}, FlashInfer's {want}")
    for n, default, keyword_only, var in expected:
        if var:
            continue
        assert n in by_name, f"{name}: no parameter {n}"
        p = by_name[n]
        # 1 == True in Python: a bool default must stay a bool.
        same = p.default == default and isinstance(p.default, bool) == isinstance(default, bool)
        assert same, f"{name}({n}): default {p.default!r}, FlashInfer's {default!r}"
        if keyword_only:
            assert p.kind is P.KEYWORD_ONLY, f"{name}({n}) must be keyword-only, as after *args"


@pytest.mark.parametrize("name", sorted(KEYWORD_ONLY))
def test_later_keyword_arguments(name):
    by_name = {p.name: p for p in _params(_resolve(name))}
    for n, default, _, _ in _parse(KEYWORD_ONLY[name]):
        assert n in by_name, f"{name}: no parameter {n}"
        p = by_name[n]
        assert p.default == default, f"{name}({n}): default {p.default!r}, expected {default!r}"
        if n != "backend":  # backend is positional after return_lse's place, as in 0.2.0-0.2.7
            assert p.kind is P.KEYWORD_ONLY, f"{name}({n}) must be keyword-only"


def test_properties_as_in_flashinfer():
    for cls in (cinfer.BatchDecodeWithPagedKVCacheWrapper,
                cinfer.BatchPrefillWithPagedKVCacheWrapper,
                cinfer.BatchPrefillWithRaggedKVCacheWrapper,
                cinfer.MultiLevelCascadeAttentionWrapper):
        assert isinstance(inspect.getattr_static(cls, "is_cuda_graph_enabled"), property)
    assert isinstance(inspect.getattr_static(cinfer.BatchDecodeWithPagedKVCacheWrapper,
                                             "use_tensor_cores"), property)
