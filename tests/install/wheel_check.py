"""Run by tests/install/check.sh against the wheel installed into its own folder (argv[1]), with
CINFER_JIT=off: the package must load the library shipped inside it and, on a GPU with torch,
run single and batch decode from the AOT bundle next to it (Llama-3-8B shapes, bf16: the "ci"
set), matching a float64 torch reference."""
import math
import os
import sys

import cinfer

target = os.path.realpath(sys.argv[1])
lib = os.path.realpath(cinfer.library_path())
if not lib.startswith(target + os.sep):
    sys.exit(f"wheel check: cinfer loaded {lib}, not the library inside the wheel ({target})")
print(f"wheel check: cinfer {cinfer.__version__} (library {cinfer.library_version()}) from {lib}")

try:
    import torch
except ImportError:
    print("wheel check: no torch here, import only")
    sys.exit(0)
if not torch.cuda.is_available():
    print("wheel check: no GPU here, import only")
    sys.exit(0)

torch.manual_seed(0)
hq, hk, d, page = 32, 8, 128, 16
dev = torch.device("cuda")


def reference(q, k, v):
    """softmax(q k^T / sqrt(d)) v in float64; q [Hq, D], k/v [L, Hk, D]."""
    g = hq // hk
    kk = k.double().repeat_interleave(g, dim=1)
    vv = v.double().repeat_interleave(g, dim=1)
    s = torch.einsum("hd,lhd->hl", q.double(), kk) / math.sqrt(d)
    return torch.einsum("hl,lhd->hd", torch.softmax(s, dim=-1), vv)


worst = 0.0
# Single decode over a contiguous KV.
q = torch.randn(hq, d, device=dev, dtype=torch.bfloat16)
k = torch.randn(777, hk, d, device=dev, dtype=torch.bfloat16)
v = torch.randn(777, hk, d, device=dev, dtype=torch.bfloat16)
out = cinfer.single_decode_with_kv_cache(q, k, v)
worst = max(worst, (out.double() - reference(q, k, v)).abs().max().item())

# Batch decode over a paged KV (NHD, separate K and V caches).
lens = [1, 100, 517]
pages = [(n + page - 1) // page for n in lens]
indptr = torch.tensor([0] + list(torch.tensor(pages).cumsum(0)), dtype=torch.int32, device=dev)
num_pages = int(indptr[-1])
indices = torch.randperm(num_pages, device=dev).to(torch.int32)
last = torch.tensor([n - (p - 1) * page for n, p in zip(lens, pages)], dtype=torch.int32,
                    device=dev)
k_cache = torch.randn(num_pages, page, hk, d, device=dev, dtype=torch.bfloat16)
v_cache = torch.randn(num_pages, page, hk, d, device=dev, dtype=torch.bfloat16)
qb = torch.randn(len(lens), hq, d, device=dev, dtype=torch.bfloat16)
wrapper = cinfer.BatchDecodeWithPagedKVCacheWrapper(
    torch.empty(128 << 20, dtype=torch.uint8, device=dev), "NHD")
wrapper.plan(indptr, indices, last, hq, hk, d, page, q_data_type=torch.bfloat16,
             kv_data_type=torch.bfloat16)
outb = wrapper.run(qb, (k_cache, v_cache))
for b, n in enumerate(lens):
    rows = indices[indptr[b]:indptr[b + 1]].long()
    kb = k_cache[rows].reshape(-1, hk, d)[:n]
    vb = v_cache[rows].reshape(-1, hk, d)[:n]
    worst = max(worst, (outb[b].double() - reference(qb[b], kb, vb)).abs().max().item())
torch.cuda.synchronize()
ok = worst < 2e-2
print(f"wheel check: single and batch decode with CINFER_JIT=off, max error {worst:.2e} "
      f"({'ok' if ok else 'WRONG'})")
sys.exit(0 if ok else 1)
