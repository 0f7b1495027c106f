"""The steps of a `cinfer bench serve` replay through other attention implementations, side by side.

Reads the JSON that `cinfer bench serve --json FILE` writes (each step's prefill chunks as
(qo_len, kv_len) pairs and decode requests as kv_len, with cinfer's times), takes up to
--max-steps steps spread over the replay, and times the same attention with

- PyTorch SDPA: decode as one padded batch with a length mask, prefill one request at a time
  with a bottom-right causal mask (SDPA has no soft cap: skipped for models that need one);
- FlexAttention: decode as a padded batch whose block mask skips the padding, prefill as one
  packed sequence with a per-request causal (and window) block mask; shapes are padded to
  powers of two so that only a few kernels are compiled (compilation is not timed);
- FlashInfer, when importable (never a dependency): its paged batch decode (tensor cores) and
  paged batch prefill wrappers over a page-16 cache, planned once per step like cinfer.

Every implementation runs each step's attention for every layer kind of the replay (gemma2
alternates windowed and global layers), so its per-step time adds up to the same layers as
cinfer's. Times are medians of CUDA-event timings after warm-up; data is random. Prints a Markdown
table and writes a PNG bar chart when matplotlib is importable.

Usage: python3 bench/peers.py SERVE.json [--max-steps N] [--iters N] [--png FILE]
"""
import argparse
import json
import math
import sys
import time


def log(msg):
    print(msg, flush=True)


def load(path, max_steps):
    with open(path) as f:
        run = json.load(f)
    steps = [s for s in run["steps"] if s["prefill"] or s["decode"]]
    if max_steps and len(steps) > max_steps:
        stride = len(steps) / max_steps
        steps = [steps[int(i * stride)] for i in range(max_steps)]
    return run, steps


def next_pow2(n, floor=1):
    return max(floor, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


class Timer:
    """Median milliseconds of fn() over iters runs after warm-up runs, with CUDA events."""

    def __init__(self, torch, iters):
        self.torch, self.iters = torch, iters

    def __call__(self, fn, warmup=2):
        torch = self.torch
        for _ in range(warmup):
            fn()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(self.iters):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        times.sort()
        return times[len(times) // 2]


class Peer:
    name = "?"

    def decode(self, kvs, window):
        raise NotImplementedError

    def prefill(self, pairs, window):
        raise NotImplementedError


class Sdpa(Peer):
    name = "PyTorch SDPA"

    def __init__(self, torch, model, timer):
        if model["logits_soft_cap"] > 0:
            raise RuntimeError("SDPA has no logits soft cap (model %s)" % model["name"])
        self.torch, self.m, self.timer = torch, model, timer
        import torch.nn.functional as F
        from torch.nn.attention.bias import causal_lower_right
        self.F, self.causal_lower_right = F, causal_lower_right

    def decode(self, kvs, window):
        # GQA without copies: the G query heads of a KV head are G query rows over its keys.
        torch, m = self.torch, self.m
        B, L = len(kvs), max(kvs)
        Hk, G = m["num_kv_heads"], m["num_qo_heads"] // m["num_kv_heads"]
        q = torch.randn(B, Hk, G, m["head_dim"], device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, Hk, L, m["head_dim"], device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        lens = torch.tensor(kvs, device="cuda")
        pos = torch.arange(L, device="cuda")
        keep = pos[None, :] < lens[:, None]
        if window >= 0:
            keep &= pos[None, :] >= (lens[:, None] - 1 - window)
        mask = keep[:, None, None, :]
        ms = self.timer(lambda: self.F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        del q, k, v
        return ms

    def prefill(self, pairs, window):
        torch, m = self.torch, self.m
        G = m["num_qo_heads"] // m["num_kv_heads"]
        work = []
        for qo, kv in pairs:
            q = torch.randn(1, m["num_qo_heads"], qo, m["head_dim"], device="cuda",
                            dtype=torch.bfloat16)
            k = torch.randn(1, m["num_kv_heads"], kv, m["head_dim"], device="cuda",
                            dtype=torch.bfloat16)
            if window >= 0:
                i = torch.arange(qo, device="cuda")[:, None] + (kv - qo)
                j = torch.arange(kv, device="cuda")[None, :]
                mask = (j <= i) & (j >= i - window)
            else:
                mask = self.causal_lower_right(qo, kv)
            work.append([q, k, torch.randn_like(k), mask])
        # enable_gqa where the chosen backend takes it; else K/V heads repeated (not timed).
        gqa = True
        try:
            q, k, v, mask = work[0]
            self.F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        except RuntimeError:
            gqa = False
            for w in work:
                w[1] = w[1].repeat_interleave(G, dim=1)
                w[2] = w[2].repeat_interleave(G, dim=1)

        def run():
            for q, k, v, mask in work:
                if gqa:
                    self.F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
                else:
                    self.F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        return self.timer(run)


class Flex(Peer):
    name = "FlexAttention"

    def __init__(self, torch, model, timer):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        # Inductor compiles in worker subprocesses by default; on the GPU machine (2026-11-29) a
        # worker failed ("SubprocException"), so compile in this process.
        import torch._inductor.config as inductor_config
        inductor_config.compile_threads = 1
        self.torch, self.m, self.timer = torch, model, timer
        self.create_block_mask = create_block_mask
        self.flex = torch.compile(flex_attention, dynamic=False)
        # One compiled kernel per padded shape: allow more than dynamo's default 8 before it
        # would fall back to the (dense, slow) eager path.
        import torch._dynamo.config as dynamo_config
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(dynamo_config, name):
                setattr(dynamo_config, name, 256)
        self.compile_s = 0.0
        self.shapes = set()
        cap = model["logits_soft_cap"]
        self.score_mod = (lambda s, b, h, qi, ki: cap * torch.tanh(s / cap)) if cap > 0 else None

    def _run(self, q, k, v, block_mask):
        return self.flex(q, k, v, score_mod=self.score_mod, block_mask=block_mask, enable_gqa=True)

    def _time(self, q, k, v, block_mask):
        key = (tuple(q.shape), tuple(k.shape))
        if key not in self.shapes:  # compile outside the timing
            t0 = time.time()
            self._run(q, k, v, block_mask)
            self.torch.cuda.synchronize()
            self.compile_s += time.time() - t0
            self.shapes.add(key)
        return self.timer(lambda: self._run(q, k, v, block_mask))

    # Flex's Triton template failed to compile once a K/V tensor passed 2^31 elements (64-bit
    # offsets; "Ternary expression ... inconsistent types int64 and int32", PyTorch 2.11, seen on
    # the GPU machine 2026-11-29): a decode batch is timed in groups below that size.
    MAX_ELEMENTS = (1 << 31) - 1

    def decode(self, kvs, window):
        m = self.m
        L = next_pow2(max(kvs), 1024)
        per_request = m["num_kv_heads"] * L * m["head_dim"]
        group = max(1, self.MAX_ELEMENTS // per_request)
        group = 1 << (group.bit_length() - 1)  # a power of two, as the padding is
        kvs = sorted(kvs)
        return sum(self._decode_group(kvs[i:i + group], window)
                   for i in range(0, len(kvs), group))

    def _decode_group(self, kvs, window):
        torch, m = self.torch, self.m
        B, L = next_pow2(len(kvs)), next_pow2(max(kvs), 1024)
        lens = torch.zeros(B, dtype=torch.int32, device="cuda")
        lens[: len(kvs)] = torch.tensor(kvs, dtype=torch.int32, device="cuda")

        def mask_mod(b, h, qi, ki):
            keep = ki < lens[b]
            if window >= 0:
                keep = keep & (ki >= lens[b] - 1 - window)
            return keep

        bm = self.create_block_mask(mask_mod, B, None, 1, L, device="cuda")
        q = torch.randn(B, m["num_qo_heads"], 1, m["head_dim"], device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, m["num_kv_heads"], L, m["head_dim"], device="cuda", dtype=torch.bfloat16)
        return self._time(q, k, torch.randn_like(k), bm)

    def prefill(self, pairs, window):
        torch, m = self.torch, self.m
        tq, tk = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
        Q, K = next_pow2(tq, 128), next_pow2(tk, 1024)
        q_doc = torch.full((Q,), -1, dtype=torch.int32, device="cuda")
        k_doc = torch.full((K,), -2, dtype=torch.int32, device="cuda")
        q_pos = torch.zeros(Q, dtype=torch.int32, device="cuda")
        k_pos = torch.zeros(K, dtype=torch.int32, device="cuda")
        qs = ks = 0
        for d, (qo, kv) in enumerate(pairs):
            q_doc[qs:qs + qo] = d
            q_pos[qs:qs + qo] = torch.arange(kv - qo, kv, dtype=torch.int32, device="cuda")
            k_doc[ks:ks + kv] = d
            k_pos[ks:ks + kv] = torch.arange(kv, dtype=torch.int32, device="cuda")
            qs, ks = qs + qo, ks + kv

        def mask_mod(b, h, qi, ki):
            keep = (q_doc[qi] == k_doc[ki]) & (k_pos[ki] <= q_pos[qi])
            if window >= 0:
                keep = keep & (k_pos[ki] >= q_pos[qi] - window)
            return keep

        bm = self.create_block_mask(mask_mod, None, None, Q, K, device="cuda")
        q = torch.randn(1, m["num_qo_heads"], Q, m["head_dim"], device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, m["num_kv_heads"], K, m["head_dim"], device="cuda", dtype=torch.bfloat16)
        return self._time(q, k, torch.randn_like(k), bm)


class FlashInfer(Peer):
    name = "FlashInfer"
    PAGE = 16

    def __init__(self, torch, model, timer):
        import flashinfer
        self.fi, self.torch, self.m, self.timer = flashinfer, torch, model, timer
        self.ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        self.name = "FlashInfer %s" % getattr(flashinfer, "__version__", "")

    def _table(self, kvs):
        torch, P = self.torch, self.PAGE
        pages = [(kv + P - 1) // P for kv in kvs]
        indptr = torch.tensor([0] + list(_cumsum(pages)), dtype=torch.int32, device="cuda")
        n = int(indptr[-1])
        indices = torch.randperm(n, device="cuda").to(torch.int32)
        last = torch.tensor([kv - (p - 1) * P for kv, p in zip(kvs, pages)], dtype=torch.int32,
                            device="cuda")
        shape = (n, P, self.m["num_kv_heads"], self.m["head_dim"])
        k = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        return indptr, indices, last, (k, torch.randn_like(k))

    def decode(self, kvs, window):
        torch, m = self.torch, self.m
        indptr, indices, last, cache = self._table(kvs)
        w = self.fi.BatchDecodeWithPagedKVCacheWrapper(self.ws, "NHD", use_tensor_cores=True)
        w.plan(indptr, indices, last, m["num_qo_heads"], m["num_kv_heads"], m["head_dim"],
               self.PAGE, window_left=window, logits_soft_cap=m["logits_soft_cap"],
               q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
        q = torch.randn(len(kvs), m["num_qo_heads"], m["head_dim"], device="cuda",
                        dtype=torch.bfloat16)
        return self.timer(lambda: w.run(q, cache))

    def prefill(self, pairs, window):
        torch, m = self.torch, self.m
        indptr, indices, last, cache = self._table([kv for _, kv in pairs])
        qo_indptr = torch.tensor([0] + list(_cumsum([qo for qo, _ in pairs])), dtype=torch.int32,
                                 device="cuda")
        w = self.fi.BatchPrefillWithPagedKVCacheWrapper(self.ws, "NHD")
        w.plan(qo_indptr, indptr, indices, last, m["num_qo_heads"], m["num_kv_heads"],
               m["head_dim"], self.PAGE, causal=True, window_left=window,
               logits_soft_cap=m["logits_soft_cap"], q_data_type=torch.bfloat16,
               kv_data_type=torch.bfloat16)
        q = torch.randn(int(qo_indptr[-1]), m["num_qo_heads"], m["head_dim"], device="cuda",
                        dtype=torch.bfloat16)
        return self.timer(lambda: w.run(q, cache))


def _cumsum(xs):
    total = 0
    for x in xs:
        total += x
        yield total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", help="the file `cinfer bench serve --json FILE` wrote")
    ap.add_argument("--max-steps", type=int, default=32, help="steps timed, spread over the replay")
    ap.add_argument("--iters", type=int, default=5, help="timed runs per measurement (median)")
    ap.add_argument("--png", default=None, help="chart file (default: the json's name + .png)")
    ap.add_argument("--peers", default="sdpa,flex,flashinfer",
                    help="comma list of sdpa, flex, flashinfer (FlashInfer JIT-compiles its "
                         "kernels on first use: up to a minute)")
    args = ap.parse_args()
    wanted = set(args.peers.split(","))
    unknown = wanted - {"sdpa", "flex", "flashinfer"}
    if unknown:
        log("peers: --peers %s: unknown %s, expected sdpa, flex, flashinfer"
            % (args.peers, ", ".join(sorted(unknown))))
        return 2

    try:
        run, steps = load(args.json, args.max_steps)
    except (OSError, ValueError, KeyError) as e:
        log("peers: cannot read %s: %s" % (args.json, e))
        return 1
    model = run["model"]
    windows = run["layer_window_left"]
    kinds = {w: windows.count(w) for w in windows}  # window -> layers using it
    log("peers: %d of %d steps of %s, %d layers (%s)" % (
        len(steps), len(run["steps"]), model["name"], len(windows),
        ", ".join("%d with window_left %d" % (n, w) for w, n in kinds.items())))
    try:
        import torch
    except ImportError as e:
        log("peers: PyTorch is not importable (%s); nothing to compare" % e)
        return 0
    if not torch.cuda.is_available():
        log("peers: PyTorch sees no CUDA device; nothing to compare")
        return 0
    timer = Timer(torch, args.iters)

    rows = []  # (name, decode ms, prefill ms, note), each printed as soon as it is known
    base = None

    def fmt(x):
        return "%.2f" % x if x is not None else "n/a"

    def ratio(x, b):
        return "%.2fx" % (x / b) if x and b else "n/a"

    def add(name, dec, pre, note):
        rows.append((name, dec, pre, note))
        log("| %s | %s | %s | %s | %s | %s |" % (
            name, fmt(dec), fmt(pre), ratio(dec, base[1]) if base else "n/a",
            ratio(pre, base[2]) if base else "n/a", note))

    log("(sums over the %d steps, every layer; ratios are time / cinfer's time: above 1 = slower)"
        % len(steps))
    log("\n| implementation | decode (ms) | prefill (ms) | decode vs cinfer | prefill vs cinfer | note |")
    log("|---|---|---|---|---|---|")
    if all("ms" in s for s in steps):
        add("cinfer", sum(s["ms"]["decode"] for s in steps),
            sum(s["ms"]["prefill"] for s in steps), "from the replay's JSON")
        base = rows[0]
    else:
        log("peers: the JSON has no cinfer times (written without a GPU); peers only")
    peers = []
    for key, cls in (("sdpa", Sdpa), ("flex", Flex), ("flashinfer", FlashInfer)):
        if key not in wanted:
            continue
        try:
            peers.append(cls(torch, model, timer))
        except ImportError as e:
            add(cls.name, None, None, "not importable: %s" % e)
        except Exception as e:  # a peer that cannot do this model (e.g. SDPA and soft caps)
            add(cls.name, None, None, "skipped: %s" % e)
    for peer in peers:
        t0 = time.time()
        dec = pre = 0.0
        note = ""
        try:
            for s in steps:
                for w, n in kinds.items():
                    if s["decode"]:
                        dec += n * peer.decode(s["decode"], w)
                    if s["prefill"]:
                        pre += n * peer.prefill([tuple(p) for p in s["prefill"]], w)
                torch.cuda.empty_cache()
        except Exception as e:
            add(peer.name, None, None, "failed: %s" % (str(e).splitlines() or [""])[0][:120])
            continue
        if isinstance(peer, Flex):
            note = "compiled %d shapes in %.0f s (not timed)" % (len(peer.shapes), peer.compile_s)
        add(peer.name, dec, pre, (note + "; " if note else "") + "%.0f s" % (time.time() - t0))

    png = args.png or (args.json.rsplit(".", 1)[0] + ".png")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        log("peers: matplotlib is not importable (%s); no chart" % e)
        return 0
    measured = [r for r in rows if r[1] is not None]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(measured))
    for i, (name, dec, pre, _) in enumerate(measured):
        ax.bar([x + i * width for x in (0, 1)], [dec, pre], width, label=name)
    ax.set_xticks([0.4 - width / 2, 1.4 - width / 2])
    ax.set_xticklabels(["decode", "prefill"])
    ax.set_ylabel("ms over %d steps (all layers)" % len(steps))
    ax.set_title("%s: %s" % (model["name"], run.get("device") or "?"))
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    log("peers: wrote %s" % png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
