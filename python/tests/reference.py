"""float64 PyTorch references of the attention semantics (shared/design/SEMANTICS.md), written from
the formulas, independent of cinfer. LSE is base 2; an empty row gives output 0 and LSE -inf
(also a row that a custom mask empties)."""

import math

import torch

LN2 = math.log(2.0)


def f64(t: torch.Tensor) -> torch.Tensor:
    """Exact float64 copy of a tensor of any float dtype (fp8 goes through float32)."""
    return t.to(torch.float32).to(torch.float64)


def merge_many(v: torch.Tensor, s: torch.Tensor):
    """Merge states along dim 1: v [n, k, H, D], s [n, k, H] (base 2) -> ([n, H, D], [n, H])."""
    v, s = f64(v), f64(s)
    m = s.max(dim=1).values if s.shape[1] > 0 else torch.full(
        (s.shape[0], s.shape[2]), -math.inf, dtype=torch.float64, device=s.device)
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w = torch.exp2(s - m_safe[:, None, :])  # 0 for -inf states
    total = w.sum(dim=1)
    out = (w[..., None] * v).sum(dim=1)
    empty = total == 0
    out = torch.where(empty[..., None], torch.zeros_like(out),
                      out / torch.where(empty, torch.ones_like(total), total)[..., None])
    lse = torch.where(empty, torch.full_like(total, -math.inf),
                      torch.log2(torch.where(empty, torch.ones_like(total), total)) + m_safe)
    return out, lse


def alibi_slopes(num_heads, device="cpu"):
    """The ALiBi paper's slopes (Press et al. 2022), float64 [num_heads]: for n, the largest
    power of two <= num_heads, the geometric series 2^(-8/n), 2^(-16/n), ... for the first n
    heads; the heads beyond take the odd terms of the 2n-head series, 2^(-8/(2n)) * (2^(-8/(2n))
    raised to 0, 2, 4, ...)."""
    n = 2 ** math.floor(math.log2(num_heads))
    slopes = [(2.0 ** (-8.0 / n)) ** (h + 1) for h in range(n)]
    slopes += [(2.0 ** (-8.0 / (2 * n))) ** (2 * m + 1) for m in range(num_heads - n)]
    return torch.tensor(slopes, dtype=torch.float64, device=device)


def rope_freqs(rotary_dim, rope_scale=1.0, rope_theta=1e4, device="cpu"):
    """float64 [rotary_dim / 2]: pair m turns by rope_theta^(-2m / rotary_dim) / rope_scale
    radians per position (Su et al. 2021; positions divided by rope_scale)."""
    m = torch.arange(rotary_dim // 2, dtype=torch.float64, device=device)
    return rope_theta ** (-2.0 * m / rotary_dim) / rope_scale


def rope_rotate(x, cos, sin, rotary_dim, interleave):
    """x [n, H, D] float64 with its first rotary_dim dims rotated (the rest copied); cos, sin
    [n, rotary_dim / 2]. Pairs: (2m, 2m + 1) interleaved, else rotate-half (m, m + rotary_dim/2)."""
    out = x.clone()
    r = rotary_dim
    idx1 = (torch.arange(0, r, 2, device=x.device) if interleave
            else torch.arange(r // 2, device=x.device))
    idx2 = idx1 + 1 if interleave else idx1 + r // 2
    x1, x2 = x[..., idx1], x[..., idx2]
    c, s = cos[:, None, :], sin[:, None, :]
    out[..., idx1] = x1 * c - x2 * s
    out[..., idx2] = x2 * c + x1 * s
    return out


def rope_llama(x, pos, rope_scale=1.0, rope_theta=1e4):
    """Llama's rotary embedding (rotate-half over the whole head dim) of x [n, H, D] float64,
    row t at position pos[t]: the in-kernel RoPE of the attention functions."""
    d = x.shape[-1]
    angle = (pos.to(device=x.device, dtype=torch.float64)[:, None]
             * rope_freqs(d, rope_scale, rope_theta, x.device))
    return rope_rotate(x, torch.cos(angle), torch.sin(angle), d, False)


def decode(q, k, v, *, sm_scale=None, logits_soft_cap=None, window_left=-1, k_scale=1.0,
           v_scale=1.0, alibi_slopes=None, rope=None, sinks=None):
    """One request: q [Hq, D]; k, v [kv_len, Hk, D] (NHD) -> out [Hq, D], lse [Hq] (base 2).
    alibi_slopes [Hq]: adds slope_h * (j - (kv_len - 1)) to the scaled logit. rope =
    (rope_scale, rope_theta): in-kernel RoPE, q rotated at kv_len - 1 and k_j at j. sinks [Hq]:
    the built-in "sinks" variant, one more logit per head in the softmax's denominator (no
    value); needs kv_len >= 1."""
    q, k, v = f64(q), f64(k), f64(v)
    hq, d = q.shape
    kv_len, hk, _ = k.shape
    if rope is not None:
        q = rope_llama(q[None], torch.tensor([kv_len - 1]), *rope)[0]
        k = rope_llama(k, torch.arange(kv_len), *rope)
    group = hq // hk
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(d)
    kk = k.repeat_interleave(group, dim=1)  # [kv_len, Hq, D]
    vv = v.repeat_interleave(group, dim=1)
    s = torch.einsum("hd,lhd->hl", q, kk) * (sm_scale * k_scale)
    if alibi_slopes is not None:
        j = torch.arange(kv_len, device=q.device, dtype=torch.float64)
        s = s + f64(alibi_slopes)[:, None] * (j - (kv_len - 1))[None, :]
    if logits_soft_cap:
        s = logits_soft_cap * torch.tanh(s / logits_soft_cap)
    if window_left >= 0:
        j = torch.arange(kv_len, device=q.device)
        s = s.masked_fill((j < kv_len - 1 - window_left)[None, :], -math.inf)
    if sinks is not None:
        full = torch.cat([s, f64(sinks)[:, None]], dim=1)
        lse_e = torch.logsumexp(full, dim=1)
        return torch.einsum("hl,lhd->hd", torch.exp(s - lse_e[:, None]), vv) * v_scale, lse_e / LN2
    lse = torch.logsumexp(s, dim=1) / LN2 if kv_len > 0 else torch.full(
        (hq,), -math.inf, dtype=torch.float64, device=q.device)
    if kv_len == 0:
        return torch.zeros((hq, d), dtype=torch.float64, device=q.device), lse
    p = torch.softmax(s, dim=1)
    return torch.einsum("hl,lhd->hd", p, vv) * v_scale, lse


def tolerance(dtype):
    """(atol, rtol) for an output stored in dtype after float32 accumulation."""
    if dtype == torch.bfloat16:
        return 1.5e-2, 1.5e-2
    return 2e-3, 2e-3


def prefill(q, k, v, *, causal=False, sm_scale=None, logits_soft_cap=None, window_left=-1,
            mask=None, alibi_slopes=None, rope=None, rope_round=None):
    """One request: q [qo_len, Hq, D]; k, v [kv_len, Hk, D] (NHD) -> out [qo_len, Hq, D], lse
    [qo_len, Hq] (base 2). Query row i is at position p_i = i + kv_len - qo_len (bottom-right).
    mask: bool [qo_len, kv_len], False drops the element (on top of causal and window, which the
    caller turns off where a custom mask replaces them); alibi_slopes [Hq]: adds
    slope_h * (j - p_i) to the scaled logit; rope = (rope_scale, rope_theta): in-kernel RoPE,
    q_i rotated at p_i and k_j at j; rope_round: a 16-bit dtype the rotated q and k are rounded
    to, as the prefill kernels do before their tensor-core products (cinfer.h)."""
    q, k, v = f64(q), f64(k), f64(v)
    qo_len, hq, d = q.shape
    kv_len, hk, _ = k.shape
    if rope is not None:
        q = rope_llama(q, torch.arange(qo_len) + (kv_len - qo_len), *rope)
        k = rope_llama(k, torch.arange(kv_len), *rope)
        if rope_round is not None:
            q, k = q.to(rope_round).double(), k.to(rope_round).double()
    group = hq // hk
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(d)
    kk = k.repeat_interleave(group, dim=1)  # [kv_len, Hq, D]
    vv = v.repeat_interleave(group, dim=1)
    s = torch.einsum("ihd,jhd->hij", q, kk) * sm_scale  # [Hq, qo_len, kv_len]
    pos = torch.arange(qo_len, device=q.device)[:, None] + (kv_len - qo_len)  # p_i
    j = torch.arange(kv_len, device=q.device)[None, :]
    if alibi_slopes is not None:
        s = s + f64(alibi_slopes)[:, None, None] * (j - pos).to(torch.float64)[None]
    if logits_soft_cap:
        s = logits_soft_cap * torch.tanh(s / logits_soft_cap)
    keep = torch.ones((qo_len, kv_len), dtype=torch.bool, device=q.device)
    if causal:
        keep &= j <= pos
    if window_left >= 0:
        keep &= j >= pos - window_left
    if mask is not None:
        keep &= mask.to(device=q.device, dtype=torch.bool)
    s = s.masked_fill(~keep[None], -math.inf)
    lse = torch.logsumexp(s, dim=2)  # -inf for rows without a kept position
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    out = torch.einsum("hij,jhd->ihd", p, vv)
    return out, (lse / LN2).transpose(0, 1)
