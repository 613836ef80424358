#!/usr/bin/env python3
"""faiss-cpu baseline for the top-k kNN benchmark of `cargo bench --bench eval_sop`.

Reads the same embeddings file the Rust benchmark writes (`--write-npy`), L2-normalises it as
our engine does, and times an exact `IndexFlatIP` search of every item against all items with
k + 1 neighbours (the +1 is the query itself, dropped afterwards, as pytorch-metric-learning and
HAPPIER do). Wall time and the process's peak RSS are printed as one JSON line.

    python3 -m venv .venv-bench && .venv-bench/bin/pip install numpy faiss-cpu threadpoolctl
    .venv-bench/bin/python benches/faiss_knn.py target/sop_bench.npy --k 1000 --threads 2

faiss's products run in its bundled OpenBLAS, which picks its kernels from the CPU model. On a
virtual machine that reports a generic model ("Intel(R) Xeon(R) Processor") OpenBLAS falls back
to its SSE3 "Prescott" kernels and faiss runs 3-4x slower than it can (measured 2026-11-27:
124 s against 34 s with OPENBLAS_CORETYPE=SkylakeX on an AVX-512 Xeon VM). Compare against
faiss at its best: set OPENBLAS_CORETYPE to the CPU's family (SkylakeX for AVX-512, Haswell for
AVX2); the JSON line records the kernel OpenBLAS used (needs threadpoolctl).
"""
import argparse
import json
import resource
import time

import faiss
import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("embeddings", help=".npy file, N x D float32")
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--check", help="optional .npy of our top-k indices (N x k, uint32) to compare")
    args = ap.parse_args()

    faiss.omp_set_num_threads(args.threads)
    x = np.load(args.embeddings).astype(np.float32, copy=False)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    t0 = time.perf_counter()
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    scores, idx = index.search(x, args.k + 1)
    elapsed = time.perf_counter() - t0
    out = {
        "tool": f"faiss-cpu {faiss.__version__} IndexFlatIP",
        "n": int(x.shape[0]),
        "d": int(x.shape[1]),
        "k": args.k,
        "threads": args.threads,
        "seconds": round(elapsed, 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    try:
        from threadpoolctl import threadpool_info

        out["openblas"] = sorted(
            {i.get("architecture") or "?" for i in threadpool_info() if i.get("internal_api") == "openblas"}
        )
    except ImportError:
        out["openblas"] = "unknown (pip install threadpoolctl)"
    if args.check:
        ours = np.load(args.check)
        # Drop the query itself (first hit) before comparing with ours (SameIndex exclusion).
        theirs = idx[:, 1:]
        out["same_top1"] = float(np.mean(ours[:, 0] == theirs[:, 0]))
        out["same_topk_sets"] = float(
            np.mean([len(set(a) & set(b)) / args.k for a, b in zip(ours[:2000], theirs[:2000])])
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
