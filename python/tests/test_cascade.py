"""MultiLevelCascadeAttentionWrapper: cascade attention over levels of a paged cache equals plain
attention over each request's concatenated KV (float64 reference), for decode and append steps,
two and three levels, empty unique parts; and equals the plain batch prefill wrapper."""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cinfer  # noqa: E402
import reference  # noqa: E402

DEV = "cuda"
D = 128


def i32(x):
    return torch.tensor(x, dtype=torch.int32)


class Pool:
    """A paged cache from which pages are handed out in a shuffled order."""

    def __init__(self, num_pages, page_size, hk, dtype, seed):
        g = torch.Generator(DEV).manual_seed(seed)
        self.cache = torch.randn(num_pages, 2, page_size, hk, D, generator=g,
                                 device=DEV).to(dtype)
        self.free = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed))
        self.free = self.free.tolist()
        self.page_size = page_size

    def take(self, tokens):
        n = math.ceil(tokens / self.page_size)
        pages, self.free = self.free[:n], self.free[n:]
        return pages, (tokens - (n - 1) * self.page_size) if n else 1

    def tokens(self, pages, length):
        """k, v [length, Hk, D] of a page list."""
        idx = torch.tensor(pages, dtype=torch.long, device=DEV)
        g = self.cache[idx]  # [n, 2, page, Hk, D]
        k = g[:, 0].reshape(-1, g.shape[-2], D)[:length]
        v = g[:, 1].reshape(-1, g.shape[-2], D)[:length]
        return k, v


def table(groups):
    """(indptr, indices, last_page_len) of a list of (pages, last)."""
    indptr, indices, last = [0], [], []
    for pages, lp in groups:
        indices += pages
        indptr.append(len(indices))
        last.append(lp)
    return i32(indptr), i32(indices if indices else [0]), i32(last)


@pytest.mark.parametrize("levels,qo_per_request,prefix_pages_n",
                         [(2, 1, 40), (2, 5, 40), (3, 1, 40), (3, 4, 40),
                          (2, 1, 301), (3, 2, 200)])
def test_cascade_equals_plain_attention(levels, qo_per_request, prefix_pages_n):
    """Prefixes of 40, 200 and 301 pages (up to 4816 tokens over a few query rows)."""
    hq, hk, page_size, dtype, batch = 32, 8, 16, torch.float16, 6
    prefix_len = prefix_pages_n * page_size  # whole pages, so the plain table can concatenate
    group_len = 3 * page_size  # level 1 of three levels: a prefix per pair of requests
    gen = torch.Generator().manual_seed(levels * 10 + qo_per_request)
    unique = [qo_per_request + int(x) for x in torch.randint(0, 90, (batch,), generator=gen)]
    if qo_per_request == 1:
        unique[2] = 0  # nothing of its own: its query is the prefix's last position
    pool = Pool(prefix_pages_n + 160, page_size, hk, dtype, seed=levels)
    prefix_pages, prefix_last = pool.take(prefix_len)
    group = [pool.take(group_len) for _ in range(batch // 2)] if levels == 3 else []
    own = [pool.take(n) for n in unique]

    qo = [qo_per_request] * batch
    if qo_per_request > 1:
        qo[1] = 0  # a request without query rows this step
    qo_indptr = [0]
    for n in qo:
        qo_indptr.append(qo_indptr[-1] + n)
    rows = qo_indptr[-1]
    qo_arr = [i32([0, rows])]
    kv_tables = [table([(prefix_pages, prefix_last)])]
    if levels == 3:
        qo_arr.append(i32([qo_indptr[2 * g] for g in range(batch // 2)] + [rows]))
        kv_tables.append(table(group))
    qo_arr.append(i32(qo_indptr))
    kv_tables.append(table(own))

    ws = torch.empty(64 << 20, dtype=torch.uint8, device=DEV)
    w = cinfer.MultiLevelCascadeAttentionWrapper(levels, ws, "NHD")
    w.plan(qo_arr, [t[0] for t in kv_tables], [t[1] for t in kv_tables],
           [t[2] for t in kv_tables], hq, hk, D, page_size, causal=True)
    q = torch.randn(rows, hq, D, device=DEV).to(dtype)
    out, lse = w.run(q, pool.cache, return_lse=True)
    assert torch.equal(w.run(q, pool.cache), out)

    pk, pv = pool.tokens(prefix_pages, prefix_len)
    ref_out = torch.zeros(rows, hq, D, dtype=torch.float64, device=DEV)
    ref_lse = torch.zeros(rows, hq, dtype=torch.float64, device=DEV)
    plain_groups = []
    for b in range(batch):
        parts_k, parts_v, pages = [pk], [pv], list(prefix_pages)
        if levels == 3:
            gk, gv = pool.tokens(group[b // 2][0], group_len)
            parts_k.append(gk)
            parts_v.append(gv)
            pages += group[b // 2][0]
        ok, ov = pool.tokens(own[b][0], unique[b])
        k = torch.cat(parts_k + [ok])
        v = torch.cat(parts_v + [ov])
        pages += own[b][0]
        plain_groups.append((pages, own[b][1] if own[b][0] else page_size))
        s, e = qo_indptr[b], qo_indptr[b + 1]
        if e > s:
            ref_out[s:e], ref_lse[s:e] = reference.prefill(q[s:e], k, v, causal=True)
    atol, rtol = reference.tolerance(dtype)
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=rtol)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)

    # The same step as one plain batch prefill over the concatenated page tables.
    plain = cinfer.BatchPrefillWithPagedKVCacheWrapper(ws)
    indptr, indices, last = table(plain_groups)
    plain.plan(i32(qo_indptr), indptr, indices, last, hq, hk, D, page_size, causal=True)
    torch.testing.assert_close(plain.run(q, pool.cache).double(), out.double(), atol=atol,
                               rtol=rtol)
