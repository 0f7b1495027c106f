/* Checks of cinfer_attention_options_t shared by every attention operation. */
#ifndef CINFER_OPS_OPTIONS_H
#define CINFER_OPS_OPTIONS_H

#include "ops/tensor.h"
#include "pos_rope_params.h"

/* The cinfer dtype of a DLPack dtype (CINFER__DT_NONE for any other). */
cinfer__dtype_t cinfer__dl_dtype(DLDataType d);

/*
 * The checks every attention operation shares, each failure naming the field: NULL, size and
 * version, head counts and GQA divisibility, head_dim >= 1, head_dim_vo >= 0, kv_layout, q_dtype
 * fp16/bf16, kv_dtype in kv_dtypes (a CINFER__DTS set; `kv_hint` says what the operation expects,
 * e.g. "the q_dtype"), sm_scale, logits_soft_cap, window_left, k_scale, v_scale, and
 * pos_encoding_mode with RoPE's rope_scale, rope_theta and head dim (a multiple of 16).
 * Operation-specific limits (head dim multiples, page size, batch fields) are checked by the caller
 * afterwards.
 */
cinfer_status_t cinfer__attention_options_check(const cinfer_attention_options_t *o,
                                                uint32_t kv_dtypes, const char *kv_hint);

/* D of v and out: options->head_dim_vo, or head_dim when it is 0. */
int cinfer__attention_head_dim_vo(const cinfer_attention_options_t *o);

/* SUCCESS when v and out have q's head dim (head_dim_vo 0 or head_dim), else UNSUPPORTED naming
 * `what` (an operation without D_qk != D_vo, e.g. "batch decode"). */
cinfer_status_t cinfer__attention_same_head_dims(const cinfer_attention_options_t *o,
                                                 const char *what);

/* Whether the options ask for in-kernel RoPE (pos_encoding_mode = ROPE_LLAMA). */
bool cinfer__attention_rope(const cinfer_attention_options_t *o);

/* With in-kernel RoPE, qo_len and kv_len of one request must be at most CINFER_ROPE_MAX_LEN
 * (UNSUPPORTED naming `what`, e.g. "request 3"); without it, always SUCCESS. */
cinfer_status_t cinfer__attention_rope_lens(const cinfer_attention_options_t *o, int64_t qo_len,
                                            int64_t kv_len, const char *what);

/*
 * The frequency table the in-kernel RoPE kernels take as their last parameter
 * (kernels/pos_rope_params.h): pair m < head_dim / 2 gets f = rope_theta^(-2m / head_dim) /
 * (2 pi rope_scale) in float64, split into float32 hi = (float)f and lo = (float)(f - hi); the
 * rest is zero, all of it without RoPE. head_dim must be at most 2 * CINFER_POS_ROPE_MAX_PAIRS
 * (the attention operations' limit of 256); pairs past the table are left out.
 */
void cinfer__attention_rope_params(const cinfer_attention_options_t *o,
                                   cinfer_pos_rope_params *out);

/*
 * The logit scales every attention kernel takes (its params struct). *sm_scale: options->sm_scale,
 * or 1/sqrt(head_dim) for 0. *q_scale: sm_scale * k_scale * log2(e), so exp2 of the scaled dot
 * product is exp of the natural logit; with a soft cap c, sm_scale * k_scale / c and
 * *soft_cap_log2 = c * log2(e) (the kernels compute c log2(e) tanh(q . k * q_scale)), else
 * *soft_cap_log2 = 0; a variant whose logit hooks take natural-log units keeps log2(e) out.
 */
void cinfer__attention_logit_scales(const cinfer_attention_options_t *o, double *sm_scale,
                                    double *q_scale, float *soft_cap_log2);

#endif
