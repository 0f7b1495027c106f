"""FlashInfer's ``custom_mask`` / ``packed_custom_mask`` and ``pos_encoding_mode="ALIBI"``, carried
out by the library's built-in variants ``"custom_mask"`` and ``"alibi"`` (``include/cinfer.h``,
"Attention variants"); the attention functions call these helpers instead of refusing the
arguments.

Custom masks (SEMANTICS.md): one boolean ``[qo_len, kv_len]`` matrix per request, row-major,
``True`` keeping the element; a batch's matrices are concatenated in request order (FlashInfer's
flattened layout). Packed, as ``packbits(..., bitorder="little")`` writes it, element ``e`` of a
request's matrix is bit ``e % 8`` of byte ``e // 8`` of the request's segment; each segment
starts on a byte of its own, where ``segment_packbits(custom_mask, bit_indptr, "little")`` puts
it: request ``b``'s segment begins at byte ``mask_indptr[b]``, with
``mask_indptr[b+1] - mask_indptr[b] = ceil(qo_len_b * kv_len_b / 8)``. Query row ``i`` of a
matrix is the request's position ``i + kv_len - qo_len`` (bottom-right aligned, as the causal
mask). A custom mask replaces the causal mask (FlashInfer applies ``causal`` only without one);
a sliding window still applies on top of it.

The "custom_mask" variant reads bit ``row_offset[b] + qo_idx * row_stride[b] + kv_idx`` with
``qo_idx`` the absolute position, so ``row_stride[b] = kv_len_b`` and
``row_offset[b] = 8 * mask_indptr[b] - (kv_len_b - qo_len_b) * kv_len_b``.

ALiBi: the "alibi" variant with ``maybe_alibi_slopes`` NULL and ``num_heads = num_qo_heads``
adds ``slope_h * (j - p_i)`` to the scaled logit, with the ALiBi paper's slopes: ``2^(-8(h+1)/n)``
for the first ``n`` heads (``n`` the largest power of two not above the head count), then the
odd terms ``2^(-4(2(h-n)+1)/n)``, which is FlashInfer's ``get_alibi_slopes``.

Both are variants, and a call runs one variant, so neither combines with a user variant or with
the other; nor with ``logits_soft_cap``, which the library does not take with a variant.
"""

from __future__ import annotations

from typing import Optional, Tuple

from . import _args as A
from . import _tensor as T
from . import quantization as Q
from . import variant as V
from .errors import ArgumentError, UnsupportedError

# What feature() returns for ALiBi (a mask is named by its argument).
ALIBI = "pos_encoding_mode='ALIBI'"
# segment_packbits takes an int32 indptr of bits.
_MAX_UNPACKED_BITS = 2**31 - 1
_PACKED_TEXT = "torch.uint8 (packbits / segment_packbits with bitorder='little')"


def feature(custom_mask, packed_custom_mask, pos_encoding_mode: str) -> Optional[str]:
    """*Pure.* The FlashInfer argument that asks for a built-in variant (``"packed_custom_mask"``,
    ``"custom_mask"`` or ``"pos_encoding_mode='ALIBI'"``), or None. ``pos_encoding_mode`` must
    have passed :func:`cinfer._args.pos_encoding_mode`. A mask together with ALiBi raises
    UnsupportedError."""
    mask = ("packed_custom_mask" if packed_custom_mask is not None
            else "custom_mask" if custom_mask is not None else None)
    alibi = pos_encoding_mode == "ALIBI"
    if mask is not None and alibi:
        raise UnsupportedError(
            f"{mask} together with pos_encoding_mode='ALIBI' is not supported: cinfer runs each "
            "as a built-in attention variant and one call takes one variant; write a "
            "cinfer.Variant with both a logits transform and a logits mask instead"
        )
    return mask or (ALIBI if alibi else None)


def check_combination(what: Optional[str], variant: Optional[V.Variant], logits_soft_cap,
                      where: str) -> None:
    """*Pure.* Refuses a mask or ALiBi (``what``, from :func:`feature`) together with a user
    variant or a soft cap."""
    if what is None:
        return
    if variant is not None:
        raise UnsupportedError(
            f"{where}: {what} together with variant={variant.name!r} is not supported: cinfer "
            f"computes {what} with its built-in variant {_builtin_name(what)!r}, and one call "
            "takes one variant; put the mask (variant_logits_mask) or the bias "
            "(variant_logits_transform) into your variant's source instead"
        )
    if A.soft_cap(logits_soft_cap) > 0:
        raise UnsupportedError(
            f"{where}: logits_soft_cap = {logits_soft_cap!r} together with {what} is not "
            f"supported: cinfer computes {what} with its built-in variant "
            f"{_builtin_name(what)!r}, and the library takes no soft cap with a variant"
        )


def _builtin_name(what: str) -> str:
    return "alibi" if what == ALIBI else "custom_mask"


def refuse_variant_args(what: str, given: bool, where: str) -> None:
    """TypeError when variant arguments are given to a call whose variant is a built-in that
    cinfer fills itself (``what`` from :func:`feature`)."""
    if given:
        raise TypeError(
            f"{where}: variant arguments given, but {what} runs the built-in variant "
            f"{_builtin_name(what)!r}, whose arguments cinfer fills itself; pass none"
        )


def alibi(num_qo_heads: int) -> Tuple[V.Variant, tuple]:
    """The "alibi" variant and its arguments for FlashInfer's default slopes."""
    return V.variant_builtin("alibi"), (None, int(num_qo_heads))


def mask_variant() -> V.Variant:
    return V.variant_builtin("custom_mask")


def _packed(t, name: str, need: int, device, any_device: bool):
    """``t`` checked as packed mask bytes (1-D uint8, at least ``need`` bytes), contiguous on
    ``device`` (moved there when ``any_device`` and it is a CPU tensor)."""
    torch = T.torch_module()
    t = T.as_tensor(t, name)
    if any_device and t.device.type == "cpu":
        t = t.to(device)
    T.check_cuda(t, name, device)
    T.check_ndim(t, name, 1, "[num_bytes] packed bits")
    T.check_dtype(t, name, (torch.uint8,), _PACKED_TEXT, unsupported=False)
    if t.shape[0] < need:
        raise ArgumentError(
            f"{name}: {t.shape[0]} bytes, expected at least {need} (the packed "
            "[qo_len, kv_len] mask of every request, each starting on a byte of its own)"
        )
    return _nonempty(t.contiguous(), device)


def _nonempty(t, device):
    """``t``, or one zero byte for an empty tensor (which has no data pointer for the library;
    no bit of it is read then)."""
    torch = T.torch_module()
    return t if t.numel() > 0 else torch.zeros(1, dtype=torch.uint8, device=device)


def _bool_mask(t, name: str, numel: int, shape_text: str, device, any_device: bool):
    torch = T.torch_module()
    t = T.as_tensor(t, name)
    if any_device and t.device.type == "cpu":
        t = t.to(device)
    T.check_cuda(t, name, device)
    T.check_dtype(t, name, (torch.bool,), "torch.bool (True keeps the element; give packed "
                  "bytes as packed_custom_mask)", unsupported=False)
    if t.numel() != numel:
        raise ArgumentError(f"{name}: shape {list(t.shape)}, expected {shape_text}")
    return t.reshape(-1)


def single_mask(custom_mask, packed_custom_mask, qo_len: int, kv_len: int, device):
    """The "custom_mask" variant's arguments ``(packed_mask, row_offset, row_stride)`` for one
    request, on ``device``. ``packed_custom_mask`` wins over ``custom_mask`` when both are given
    (FlashInfer ignores ``custom_mask`` then). Only kernel launches and device allocations (no
    host copy), so a call stays capturable in a CUDA graph."""
    torch = T.torch_module()
    n = qo_len * kv_len
    if packed_custom_mask is not None:
        packed = _packed(packed_custom_mask, "packed_custom_mask", (n + 7) // 8, device, False)
    else:
        bits = _bool_mask(custom_mask, "custom_mask", n,
                          f"[qo_len, kv_len] = [{qo_len}, {kv_len}] (or {n} elements flattened)",
                          device, False)
        packed = (Q.packbits_impl(bits, "little") if n > 0
                  else torch.zeros(1, dtype=torch.uint8, device=device))
    row_offset = torch.full((1,), -(kv_len - qo_len) * kv_len, dtype=torch.int64, device=device)
    row_stride = torch.full((1,), kv_len, dtype=torch.int32, device=device)
    return packed, row_offset, row_stride


def batch_layout(qo_lens, kv_lens):
    """From host int64 tensors of the requests' lengths: ``mask_indptr`` (bytes, int64
    ``[batch + 1]``), ``row_offset`` (int64 ``[batch]``), ``row_stride`` (int32 ``[batch]``) and
    the bit indptr of the unpacked mask (int64 ``[batch + 1]``)."""
    torch = T.torch_module()
    sizes = qo_lens * kv_lens
    zero = torch.zeros(1, dtype=torch.int64)
    bit_indptr = torch.cat([zero, torch.cumsum(sizes, 0)])
    mask_indptr = torch.cat([zero, torch.cumsum((sizes + 7) // 8, 0)])
    row_offset = 8 * mask_indptr[:-1] - (kv_lens - qo_lens) * kv_lens
    return mask_indptr, row_offset, kv_lens.to(torch.int32), bit_indptr


def batch_mask(custom_mask, packed_custom_mask, qo_lens, kv_lens, device):
    """The packed mask of a batch on ``device`` (the caller's ``packed_custom_mask`` itself when
    it is a contiguous tensor there, else packed with ``segment_packbits``), and the host
    ``mask_indptr``, ``row_offset``, ``row_stride`` of :func:`batch_layout`. CPU mask tensors
    are copied to ``device``."""
    torch = T.torch_module()
    mask_indptr, row_offset, row_stride, bit_indptr = batch_layout(qo_lens, kv_lens)
    total_bits = int(bit_indptr[-1])
    if packed_custom_mask is not None:
        packed = _packed(packed_custom_mask, "packed_custom_mask", int(mask_indptr[-1]), device,
                         True)
        return packed, mask_indptr, row_offset, row_stride
    if total_bits > _MAX_UNPACKED_BITS:
        raise UnsupportedError(
            f"custom_mask: the batch's masks have {total_bits} elements, more than "
            "segment_packbits' int32 indptr can address (2^31 - 1): pack them yourself and "
            "pass packed_custom_mask"
        )
    bits = _bool_mask(custom_mask, "custom_mask", total_bits,
                      f"the flattened masks of all requests, sum(qo_len[i] * kv_len[i]) = "
                      f"{total_bits} elements", device, True)
    if total_bits == 0:
        packed = torch.zeros(1, dtype=torch.uint8, device=device)
    else:
        packed, _ = Q.segment_packbits_impl(bits, bit_indptr.to(torch.int32).to(device),
                                            "little")
    return _nonempty(packed, device), mask_indptr, row_offset, row_stride

