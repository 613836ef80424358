#!/usr/bin/env python3
"""SOP-scale evaluation anchor in plain PyTorch (issue 20), for comparison with rankwise's
evaluation engine (`cargo bench --bench eval_sop`, `rankwise eval --device cuda`) on the same GPU.

Data: N = 60,502 embeddings of dimension 512 (the size of SOP's test split), random normal
and L2-normalised, and SOP-like labels: 11,316 classes of 5 or 6 consecutive items (the first
3,922 classes have 6, the others 5; for other --n, round(N * 11316 / 60502) classes sized the
same way). The generator, for reference: `g = torch.Generator().manual_seed(seed);
x = torch.randn(n, dim, generator=g); x = x / x.norm(dim=1, keepdim=True)` (float32, CPU).
Random embeddings put the metrics near chance (R@1 about 4 / N), which is fine for timing;
`--embeddings/--labels` evaluate given files instead (e.g. `rankwise gen-embeddings --preset
sop --out-dir DIR`, whose metrics look like a trained model's), and `--write DIR` saves the
data as DIR/embeddings.npy (float32, N x D) + DIR/labels.csv (header `class_id`), so that
rankwise can evaluate the identical embeddings:

    rankwise eval --embeddings DIR/embeddings.npy --labels DIR/labels.csv --no-hierarchical --device cuda

Phases, each timed end to end with `torch.cuda.synchronize()` (the data generation, file
writing and result checks are not timed):

(a) knn: top-k (k = 1000) most similar items of every item, itself excluded (its score is set to
    -inf), by cosine similarity: host->device copy of the embeddings, L2 normalisation (as
    rankwise's cosine similarity does), then per chunk of queries one matmul against all items
    and `torch.topk`; scores and indices stay on the device, then are copied back to the host
    (timed separately: d2h_s).
(b) rank: the full-ranking baseline: per chunk of queries, the similarity rows, a full stable
    `argsort` (descending; ties by item index, rankwise's tie rule), the relevance of the sorted
    list (same class), and from it, vectorised: R@1/10/100/1000 (1 if a positive is among the
    first k: the metric-learning "recall rate"), mAP@R (Musgrave et al.), R-precision and mAP
    (average precision over all positives, HAPPIER Eq. 1), averaged over the queries with at
    least one positive. Timed from the host->device copy of embeddings and labels to the final
    means on the host. Checked on the CPU against `rankwise eval --no-hierarchical` on the same
    files: R@k and R-precision identical, mAP@R and mAP within 1e-8 (P(i) is formed in float32
    here).

Chunk sizes: --chunk, or automatic: as many query rows as fit in half the free GPU memory
(CUDA) or --mem-gb (CPU, default 2 GB) at ~16 (knn) / ~64 (rank) bytes per score, at most 2^30
scores per chunk.

GPU machine (about 15-25 s in all on an H100, most of it start-up, data generation and the
full sort):

    python3 benches/eval_topk_torch.py --device cuda --write target/eval_anchor --out target/torch_eval_cuda.jsonl

CPU test at a small size:

    /work/venv-torch/bin/python benches/eval_topk_torch.py --n 5000 --k 100

Output, one JSON line per phase (printed, and appended to --out): impl ("torch"), phase ("data",
"knn" or "rank"), device, gpu, torch, n, dim, k, seed, source ("random" or the files), chunk,
h2d_s, compute_s, d2h_s (knn), seconds (the phase's total), peak_mib (CUDA:
max_memory_allocated during the phase, the embeddings included; CPU: process peak RSS),
matmul_allow_tf32; knn adds mean_top1_score and knn_check (R@k for k <= --k computed from the
top-k lists, which must equal rank's up to ties); rank adds metrics {R@1, R@10, R@100, R@1000,
mAP@R, R-precision, mAP}, queries, lone_queries. The "data" line gives the class count and
generation / write times.
"""
import argparse
import csv
import json
import math
import os
import sys
import time

import numpy as np
import torch

SOP_N, SOP_CLASSES = 60_502, 11_316
RECALL_KS = (1, 10, 100, 1000)


# ---------------------------------------------------------------- data
def sop_like_labels(n):
    """Class ids 0..C-1 of n items listed class by class, C = round(n * 11316 / 60502) classes
    of as equal sizes as possible, the larger ones first (n = 60,502: 3,922 classes of 6, then
    7,394 of 5)."""
    classes = max(1, round(n * SOP_CLASSES / SOP_N))
    q, r = divmod(n, classes)
    sizes = np.array([q + 1] * r + [q] * (classes - r))
    return np.repeat(np.arange(classes, dtype=np.int64), sizes)


def random_embeddings(n, dim, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g, dtype=torch.float32)
    return x / x.norm(dim=1, keepdim=True)


def read_labels_csv(path, column):
    """One integer column of a CSV file with a header (`column`, else the first column)."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader)]
        j = header.index(column) if column in header else 0
        return np.array([int(row[j]) for row in reader if row], dtype=np.int64)


def write_data(folder, x, labels):
    """DIR/embeddings.npy (float32) and DIR/labels.csv (`class_id`), the layout of
    `rankwise gen-embeddings`."""
    os.makedirs(folder, exist_ok=True)
    np.save(os.path.join(folder, "embeddings.npy"), x.numpy().astype(np.float32, copy=False))
    with open(os.path.join(folder, "labels.csv"), "w") as f:
        f.write("class_id\n")
        f.write("\n".join(map(str, labels.tolist())))
        f.write("\n")


# ---------------------------------------------------------------- device helpers
def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def peak_rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def reset_peak(dev):
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    else:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass


def peak_mib(dev):
    return torch.cuda.max_memory_allocated(dev) / 2**20 if dev.type == "cuda" else peak_rss_mib()


def auto_chunk(n, bytes_per_score, dev, mem_gb):
    """Query rows per chunk: a memory budget (half the free GPU memory, or mem_gb) over the
    bytes that one row of n scores needs, at most 2^30 scores, a multiple of 128 when >= 128."""
    if mem_gb is not None:
        budget = mem_gb * 1e9
    elif dev.type == "cuda":
        budget = torch.cuda.mem_get_info(dev)[0] * 0.5
    else:
        budget = 2e9
    rows = int(min(budget // (n * bytes_per_score), (1 << 30) // n, n))
    if 128 <= rows < n:
        rows -= rows % 128
    return max(1, rows)


def mask_self(sims, start):
    """Sets the score of each query against itself to -inf (the query is item start + row)."""
    rows = torch.arange(sims.shape[0], device=sims.device)
    sims[rows, start + rows] = -math.inf


# ---------------------------------------------------------------- (a) top-k kNN
def knn(x_host, k, chunk, dev):
    """Top-k neighbours of every item among all others; returns (timings, scores, indices),
    the results on the host."""
    n = x_host.shape[0]
    sync(dev)
    t0 = time.perf_counter()
    e = torch.nn.functional.normalize(x_host.to(dev), dim=1)
    sync(dev)
    t1 = time.perf_counter()
    scores = torch.empty(n, k, dtype=torch.float32, device=dev)
    indices = torch.empty(n, k, dtype=torch.int64, device=dev)
    for s in range(0, n, chunk):
        sims = e[s:s + chunk] @ e.t()
        mask_self(sims, s)
        torch.topk(sims, k, dim=1, largest=True, sorted=True, out=(scores[s:s + chunk], indices[s:s + chunk]))
        del sims
    sync(dev)
    t2 = time.perf_counter()
    scores_h, indices_h = scores.cpu(), indices.cpu()
    t3 = time.perf_counter()
    return {"h2d_s": t1 - t0, "compute_s": t2 - t1, "d2h_s": t3 - t2, "seconds": t3 - t0}, scores_h, indices_h


def recall_from_knn(indices, labels, ks):
    """R@k (k <= the lists' length) from the top-k lists, over queries with a positive."""
    lab = torch.as_tensor(labels)
    counts = torch.bincount(lab)
    has_pos = counts[lab] > 1
    rel = lab[indices] == lab[:, None]
    return {f"R@{k}": float(rel[:, :k].any(1)[has_pos].double().mean()) for k in ks if k <= indices.shape[1]}


# ---------------------------------------------------------------- (b) full ranking
def full_ranking(x_host, labels, chunk, dev, ks):
    """Exact binary metrics from a full argsort of every query's similarity row."""
    n = x_host.shape[0]
    # Host-side, from the labels only (not timed): the largest number of positives of a query,
    # so that mAP@R looks at a fixed number of columns without a host sync per chunk.
    max_r = int(np.bincount(labels).max()) - 1
    sync(dev)
    t0 = time.perf_counter()
    e = torch.nn.functional.normalize(x_host.to(dev), dim=1)
    lab = torch.as_tensor(labels, dtype=torch.int32, device=dev)
    sync(dev)
    t1 = time.perf_counter()
    positions = torch.arange(1, n, device=dev, dtype=torch.float32)  # 1-based ranks of the n - 1 others
    in_r = torch.arange(max(max_r, 1), device=dev)
    sums = torch.zeros(len(ks) + 3, dtype=torch.float64, device=dev)  # R@k..., mAP@R, R-precision, mAP
    valid = torch.zeros((), dtype=torch.int64, device=dev)
    for s in range(0, n, chunk):
        sims = e[s:s + chunk] @ e.t()
        mask_self(sims, s)
        # The query (-inf) sorts last: drop it, leaving the n - 1 others in rank order.
        order = torch.argsort(sims, dim=1, descending=True, stable=True)[:, : n - 1]
        del sims
        rel = lab[order] == lab[s:s + chunk, None]
        del order
        cum = rel.cumsum(1, dtype=torch.int32)  # positives up to and including each position
        r = cum[:, -1]  # positives of each query
        has = r > 0
        rf = r.clamp(min=1).double()
        prec_at_pos = (cum.float() / positions) * rel  # P(i) at each positive, 0 elsewhere
        ap = prec_at_pos.sum(1, dtype=torch.float64) / rf
        w = max(max_r, 1)
        map_r = (prec_at_pos[:, :w] * (in_r < r[:, None])).sum(1, dtype=torch.float64) / rf
        r_prec = cum.gather(1, (r.clamp(min=1) - 1).long()[:, None]).squeeze(1).double() / rf
        # R@k with k > n - 1 looks at the whole list (as rankwise does).
        rows = [(cum[:, min(k, n - 1) - 1] > 0).double() for k in ks] + [map_r, r_prec, ap]
        sums += torch.stack([(v * has).sum() for v in rows])
        valid += has.sum()
        del rel, cum, prec_at_pos
    means = (sums / valid.clamp(min=1)).tolist()  # the host copy waits for the GPU
    queries = int(valid)
    t2 = time.perf_counter()
    names = [f"R@{k}" for k in ks] + ["mAP@R", "R-precision", "mAP"]
    metrics = dict(zip(names, means))
    timing = {"h2d_s": t1 - t0, "compute_s": t2 - t1, "seconds": t2 - t0}
    return timing, metrics, queries


# ---------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    ap.add_argument("--n", type=int, default=SOP_N, help="items (default 60502)")
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--k", type=int, default=1000, help="neighbours of the knn phase (default 1000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--phase", choices=["knn", "rank", "both"], default="both")
    ap.add_argument("--chunk", type=int, help="query rows per chunk, both phases (default: automatic)")
    ap.add_argument("--mem-gb", type=float, help="memory budget of a chunk (default: half the free GPU memory; CPU 2 GB)")
    ap.add_argument("--embeddings", help=".npy (N x D) to evaluate instead of random embeddings; needs --labels")
    ap.add_argument("--labels", help="labels .csv with a header (column --label-column, else the first)")
    ap.add_argument("--label-column", default="class_id")
    ap.add_argument("--write", metavar="DIR", help="write DIR/embeddings.npy and DIR/labels.csv")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--out", help="append the JSON lines to this file (they are printed too)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("eval_topk_torch.py: --device cuda but no CUDA device", file=sys.stderr)
        return 2
    out = open(args.out, "a") if args.out else None

    common = {"impl": "torch", "device": dev.type, "torch": torch.__version__}
    if dev.type == "cuda":
        common.update({"gpu": torch.cuda.get_device_name(dev), "cuda": torch.version.cuda,
                       "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32})
        # The CUDA context and cuBLAS handle, outside every timing.
        w = torch.randn(64, 64, device=dev)
        (w @ w).sum().item()

    def emit(row):
        # unix_end_ms: for scripts/gpu_check.sh's device-memory windows (nvidia-smi).
        line = json.dumps({**common, **row, "unix_end_ms": int(time.time() * 1000)})
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    # Data (not timed as part of the phases).
    t = time.perf_counter()
    if args.embeddings:
        if not args.labels:
            ap.error("--embeddings needs --labels")
        x = torch.from_numpy(np.ascontiguousarray(np.load(args.embeddings), dtype=np.float32))
        labels = read_labels_csv(args.labels, args.label_column)
        if labels.shape[0] != x.shape[0]:
            ap.error(f"{x.shape[0]} embeddings but {labels.shape[0]} labels")
        source = f"{args.embeddings} + {args.labels}"
    else:
        x = random_embeddings(args.n, args.dim, args.seed)
        labels = sop_like_labels(args.n)
        source = "random"
    gen_s = time.perf_counter() - t
    write_s = None
    if args.write:
        t = time.perf_counter()
        write_data(args.write, x, labels)
        write_s = time.perf_counter() - t
    n, dim = x.shape
    k = min(args.k, n - 1)
    info = {"n": n, "dim": dim, "k": k, "seed": args.seed, "source": source}
    emit({"phase": "data", **info, "classes": int(len(np.unique(labels))),
          "max_class_size": int(np.bincount(labels).max()), "generate_s": gen_s,
          "write_s": write_s, "written_to": args.write})

    if args.phase in ("knn", "both"):
        chunk = args.chunk or auto_chunk(n, 16, dev, args.mem_gb)
        reset_peak(dev)
        timing, scores, indices = knn(x, k, chunk, dev)
        peak = peak_mib(dev)
        emit({"phase": "knn", **info, "chunk": chunk, **timing, "peak_mib": peak,
              "mean_top1_score": float(scores[:, 0].double().mean()),
              "knn_check": recall_from_knn(indices, labels, RECALL_KS)})
        del scores, indices
    if args.phase in ("rank", "both"):
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        chunk = args.chunk or auto_chunk(n, 64, dev, args.mem_gb)
        reset_peak(dev)
        timing, metrics, queries = full_ranking(x, labels, chunk, dev, RECALL_KS)
        peak = peak_mib(dev)
        emit({"phase": "rank", **info, "chunk": chunk, **timing, "peak_mib": peak,
              "metrics": metrics, "queries": queries, "lone_queries": n - queries})
    return 0


if __name__ == "__main__":
    sys.exit(main())
