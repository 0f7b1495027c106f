"""cinfer's tensor functions as PyTorch custom operators, so ``torch.compile`` can trace code that
calls them (``fullgraph=True`` included) and ``torch.export`` can export it.

Importing this module imports torch and registers, once, the operators ``torch.ops.cinfer.*``
(``torch.library.custom_op``, PyTorch 2.4 or later), each with a fake implementation that gives
the output shapes and dtypes without running anything. Nothing else needs to change: while
torch.compile traces them, the public functions (``cinfer.single_prefill_with_kv_cache``,
``cinfer.merge_state``, ...) call these operators, and the graph holds one opaque node per call;
outside tracing they call the library directly.

It is imported for you by ``import cinfer`` when torch is already imported, and by the first
eager call of any of those functions; import it yourself when you import cinfer before torch
and compile before calling anything::

    import cinfer
    import cinfer.torch_ops  # registers torch.ops.cinfer.*

Not operators (not traceable yet): the wrappers' ``plan``/``run`` (batch decode, batch prefill,
cascade: they hold C plan objects), calls with an attention variant (a Variant is no schema
type) and calls with in-kernel RoPE (its fields are not in the operators' schemas). ``segment_packbits`` has a data-dependent output size, which torch.compile
supports only with ``torch._dynamo.config.capture_dynamic_output_shape_ops = True``.
"""

# No `from __future__ import annotations`: torch.library infers each schema from the real
# annotation objects.
from typing import Optional, Tuple

from . import _dispatch, _tensor, cascade, decode, page, prefill, quantization, rope

# torch through the package's own import of it, whose ImportError says to install torch.
torch = _tensor.torch_module()

if not hasattr(torch.library, "custom_op"):  # pragma: no cover - old PyTorch
    raise ImportError(
        f"cinfer.torch_ops needs torch.library.custom_op (PyTorch 2.4 or later); this is "
        f"PyTorch {torch.__version__}. The eager functions work without it."
    )

Tensor = torch.Tensor
_custom_op = torch.library.custom_op
_F32 = torch.float32


def _no_lse(q: Tensor, want: bool, shape) -> Tensor:
    """The LSE output of an operator: ``shape`` float32 when wanted, else an empty tensor (an
    operator cannot return None in place of a tensor)."""
    return q.new_empty(shape if want else (0,), dtype=_F32)


# ---- attention ----

@_custom_op("cinfer::single_decode", mutates_args=())
def single_decode(q: Tensor, k: Tensor, v: Tensor, kv_layout: str, k_scale: Optional[float],
                  v_scale: Optional[float], window_left: int, logits_soft_cap: Optional[float],
                  sm_scale: Optional[float], return_lse: bool) -> Tuple[Tensor, Tensor]:
    out, lse = decode.single_decode_impl(q, k, v, kv_layout, k_scale, v_scale, window_left,
                                         logits_soft_cap, sm_scale, return_lse)
    return out, (lse if lse is not None else _no_lse(q, False, ()))


@single_decode.register_fake
def _(q, k, v, kv_layout, k_scale, v_scale, window_left, logits_soft_cap, sm_scale, return_lse):
    return torch.empty_like(q, memory_format=torch.contiguous_format), _no_lse(
        q, return_lse, (q.shape[0],))


@_custom_op("cinfer::single_prefill", mutates_args=())
def single_prefill(q: Tensor, k: Tensor, v: Tensor, causal: bool, kv_layout: str,
                   sm_scale: Optional[float], window_left: int,
                   logits_soft_cap: Optional[float], return_lse: bool) -> Tuple[Tensor, Tensor]:
    out, lse = prefill.single_prefill_impl(q, k, v, causal, kv_layout, sm_scale, window_left,
                                           logits_soft_cap, return_lse)
    return out, (lse if lse is not None else _no_lse(q, False, ()))


@single_prefill.register_fake
def _(q, k, v, causal, kv_layout, sm_scale, window_left, logits_soft_cap, return_lse):
    # out has v's head dim (D_vo, which may differ from q's D_qk).
    return q.new_empty((q.shape[0], q.shape[1], v.shape[2])), _no_lse(
        q, return_lse, (q.shape[0], q.shape[1]))


@_custom_op("cinfer::merge_state", mutates_args=())
def merge_state(v_a: Tensor, s_a: Tensor, v_b: Tensor, s_b: Tensor) -> Tuple[Tensor, Tensor]:
    return cascade.merge_state_impl(v_a, s_a, v_b, s_b)


@merge_state.register_fake
def _(v_a, s_a, v_b, s_b):
    return (torch.empty_like(v_a, memory_format=torch.contiguous_format),
            s_a.new_empty(s_a.shape, dtype=_F32))


@_custom_op("cinfer::merge_state_in_place", mutates_args=("v", "s"))
def merge_state_in_place(v: Tensor, s: Tensor, v_other: Tensor, s_other: Tensor,
                         mask: Optional[Tensor]) -> None:
    cascade.merge_state_in_place_impl(v, s, v_other, s_other, mask)


@merge_state_in_place.register_fake
def _(v, s, v_other, s_other, mask):
    return None


@_custom_op("cinfer::merge_states", mutates_args=())
def merge_states(v: Tensor, s: Tensor) -> Tuple[Tensor, Tensor]:
    return cascade.merge_states_impl(v, s)


@merge_states.register_fake
def _(v, s):
    n, _, h, d = v.shape
    return v.new_empty((n, h, d)), s.new_empty((n, h), dtype=_F32)


# ---- paged KV cache ----

@_custom_op("cinfer::append_paged_kv_cache", mutates_args=("k_cache", "v_cache", "error_flag"))
def append_paged_kv_cache(append_key: Tensor, append_value: Tensor, batch_indices: Tensor,
                          positions: Tensor, k_cache: Tensor, v_cache: Optional[Tensor],
                          kv_indices: Tensor, kv_indptr: Tensor, kv_last_page_len: Tensor,
                          kv_layout: str, k_scale: Optional[float], v_scale: Optional[float],
                          error_flag: Optional[Tensor]) -> None:
    page.append_paged_kv_cache_impl(append_key, append_value, batch_indices, positions, k_cache,
                                    v_cache, kv_indices, kv_indptr, kv_last_page_len, kv_layout,
                                    k_scale, v_scale, error_flag)


@append_paged_kv_cache.register_fake
def _(append_key, append_value, batch_indices, positions, k_cache, v_cache, kv_indices,
      kv_indptr, kv_last_page_len, kv_layout, k_scale, v_scale, error_flag):
    return None


@_custom_op("cinfer::get_batch_indices_positions", mutates_args=())
def get_batch_indices_positions(append_indptr: Tensor, seq_lens: Tensor,
                                nnz: int) -> Tuple[Tensor, Tensor]:
    return page.get_batch_indices_positions_impl(append_indptr, seq_lens, nnz)


@get_batch_indices_positions.register_fake
def _(append_indptr, seq_lens, nnz):
    return (append_indptr.new_empty((nnz,), dtype=torch.int32),
            append_indptr.new_empty((nnz,), dtype=torch.int32))


@_custom_op("cinfer::get_seq_lens", mutates_args=())
def get_seq_lens(kv_indptr: Tensor, kv_last_page_len: Tensor, page_size: int) -> Tensor:
    return page.get_seq_lens_impl(kv_indptr, kv_last_page_len, page_size)


@get_seq_lens.register_fake
def _(kv_indptr, kv_last_page_len, page_size):
    return kv_last_page_len.new_empty(kv_last_page_len.shape, dtype=torch.int32)


# ---- RoPE ----

@_custom_op("cinfer::rope", mutates_args=())
def rope_(q: Tensor, k: Tensor, indptr: Optional[Tensor], offsets: Optional[Tensor],
          pos_ids: Optional[Tensor], rotary_dim: int, interleave: bool, rope_scale: float,
          rope_theta: float, llama31: bool, low_freq_factor: float, high_freq_factor: float,
          old_context_len: float) -> Tuple[Tensor, Tensor]:
    return rope.rope_impl(q, k, indptr, offsets, pos_ids, rotary_dim, interleave, rope_scale,
                          rope_theta, llama31, low_freq_factor, high_freq_factor,
                          old_context_len)


@rope_.register_fake
def _(q, k, *args):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format))


@_custom_op("cinfer::rope_inplace", mutates_args=("q", "k"))
def rope_inplace(q: Tensor, k: Tensor, indptr: Optional[Tensor], offsets: Optional[Tensor],
                 pos_ids: Optional[Tensor], rotary_dim: int, interleave: bool,
                 rope_scale: float, rope_theta: float, llama31: bool, low_freq_factor: float,
                 high_freq_factor: float, old_context_len: float) -> None:
    rope.rope_impl(q, k, indptr, offsets, pos_ids, rotary_dim, interleave, rope_scale,
                   rope_theta, llama31, low_freq_factor, high_freq_factor, old_context_len,
                   inplace=True)


@rope_inplace.register_fake
def _(q, k, *args):
    return None


@_custom_op("cinfer::rope_cos_sin_cache", mutates_args=())
def rope_cos_sin_cache(positions: Tensor, query: Tensor, key: Tensor, head_size: int,
                       cos_sin_cache: Tensor, is_neox: bool) -> Tuple[Tensor, Tensor]:
    return rope.rope_cos_sin_cache_impl(positions, query, key, head_size, cos_sin_cache, is_neox)


@rope_cos_sin_cache.register_fake
def _(positions, query, key, head_size, cos_sin_cache, is_neox):
    return (torch.empty_like(query, memory_format=torch.contiguous_format),
            torch.empty_like(key, memory_format=torch.contiguous_format))


@_custom_op("cinfer::rope_cos_sin_cache_inplace", mutates_args=("query", "key"))
def rope_cos_sin_cache_inplace(positions: Tensor, query: Tensor, key: Tensor, head_size: int,
                               cos_sin_cache: Tensor, is_neox: bool) -> None:
    rope.rope_cos_sin_cache_impl(positions, query, key, head_size, cos_sin_cache, is_neox,
                                 inplace=True)


@rope_cos_sin_cache_inplace.register_fake
def _(positions, query, key, head_size, cos_sin_cache, is_neox):
    return None


# ---- bit packing ----

@_custom_op("cinfer::packbits", mutates_args=())
def packbits(x: Tensor, bitorder: str) -> Tensor:
    return quantization.packbits_impl(x, bitorder)


@packbits.register_fake
def _(x, bitorder):
    return x.new_empty(((x.shape[0] + 7) // 8,), dtype=torch.uint8)


@_custom_op("cinfer::segment_packbits", mutates_args=())
def segment_packbits(x: Tensor, indptr: Tensor, bitorder: str) -> Tuple[Tensor, Tensor]:
    y, new_indptr = quantization.segment_packbits_impl(x, indptr, bitorder)
    # An operator's outputs must not be views (y is a prefix of a larger buffer).
    return y.clone(), new_indptr


@segment_packbits.register_fake
def _(x, indptr, bitorder):
    nbytes = torch.library.get_ctx().new_dynamic_size()
    return (x.new_empty((nbytes,), dtype=torch.uint8),
            indptr.new_empty(indptr.shape, dtype=torch.int32))


_NAMES = ("single_decode", "single_prefill", "merge_state", "merge_state_in_place",
          "merge_states", "append_paged_kv_cache", "get_batch_indices_positions",
          "get_seq_lens", "rope", "rope_inplace", "rope_cos_sin_cache",
          "rope_cos_sin_cache_inplace", "packbits", "segment_packbits")

_dispatch.installed({name: getattr(torch.ops.cinfer, name) for name in _NAMES},
                    torch.compiler.is_compiling)
