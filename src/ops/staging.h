/*
 * Plan-time staging of a schedule: two pinned host mirrors used in turn. Plan writes the schedule
 * into a mirror on the host, then copies it into the device workspace asynchronously; a mirror is
 * rewritten only after the event recorded behind its last copy has completed, so plan n waits on
 * plan n - 2's copy at most and never on the GPU's work. Shared by batch decode and batch prefill.
 */
#ifndef CINFER_OPS_STAGING_H
#define CINFER_OPS_STAGING_H

#include <stdbool.h>
#include <stddef.h>

#include "cuda/context.h"

typedef struct cinfer__staging {
    char *host;    /* 2 x stride bytes, pinned, zeroed at creation */
    size_t stride; /* one mirror, rounded up to the alignment */
    CUevent copied[2];
    bool pending[2]; /* a copy from the mirror may still be in flight */
    int next;        /* the mirror the next plan writes */
} cinfer__staging_t;

/* Allocates the mirrors for schedules of up to `bytes` bytes (rounded up to `align`) on the
 * current context (the caller activates it). `what` names the operation in messages. On failure
 * nothing is left allocated and *s is zeroed. */
cinfer_status_t cinfer__staging_create(const cinfer_context_t *ctx, cinfer__staging_t *s,
                                       size_t bytes, size_t align, const char *what);

/* *capturing = whether stream is being captured into a CUDA graph. Activates ctx. */
cinfer_status_t cinfer__stream_capturing(cinfer_context_t *ctx, CUstream stream, bool *capturing);

/* INVALID_ARGUMENT when stream is being captured into a CUDA graph: a plan copies its schedule
 * from a host mirror, which a capture would turn into a copy at every replay from whatever a
 * later plan wrote there (and its event into a captured one). Activates ctx. `what` names the
 * plan function in the message. Called before a plan touches the previous one. */
cinfer_status_t cinfer__staging_check_stream(cinfer_context_t *ctx, CUstream stream,
                                             const char *what);

/* The mirror the next plan writes, after waiting for its previous copy (if any). */
cinfer_status_t cinfer__staging_next(const cinfer_context_t *ctx, cinfer__staging_t *s,
                                     char **host);

/* Copies bytes [offset, offset + bytes) of the mirror returned by cinfer__staging_next to the
 * same offsets of device memory dst on stream, without finishing the plan: a schedule of several
 * regions copies all but the first this way, then calls cinfer__staging_copy, whose event is
 * recorded behind every copy of the stream. */
cinfer_status_t cinfer__staging_copy_range(const cinfer_context_t *ctx, const cinfer__staging_t *s,
                                           void *dst, size_t offset, size_t bytes, CUstream stream,
                                           const char *what);

/* Copies the first `bytes` of the mirror returned by cinfer__staging_next to device memory dst on
 * stream, records the mirror's event behind the copy and moves on to the other mirror. */
cinfer_status_t cinfer__staging_copy(const cinfer_context_t *ctx, cinfer__staging_t *s, void *dst,
                                     size_t bytes, CUstream stream, const char *what);

/* A caller's device workspace for an op that needs `need` bytes aligned to `align`: NULL
 * (INVALID_ARGUMENT), misaligned (INVALID_ARGUMENT) or smaller (WORKSPACE_TOO_SMALL) is an error
 * whose message names size_function, the function that gives the size. */
cinfer_status_t cinfer__check_workspace(const void *workspace, size_t workspace_bytes, size_t need,
                                        size_t align, const char *size_function);

/* The single-request ops' copy, without mirrors: activates ctx and copies `bytes` from pageable
 * host memory to device memory dst asynchronously on stream (cuMemcpyHtoDAsync stages a pageable
 * source before it returns, so the caller may free it right after). `what` names the copy in the
 * message of a CUDA error. */
cinfer_status_t cinfer__copy_pageable(cinfer_context_t *ctx, void *dst, const void *host,
                                      size_t bytes, CUstream stream, const char *what);

/* Waits for copies in flight and frees the mirrors (the context is current). */
void cinfer__staging_destroy(const cinfer_context_t *ctx, cinfer__staging_t *s);

#endif
