#!/usr/bin/env python3
"""Issue 3 losses benchmark, PyTorch side: the same formulas as rankwise, written the
straightforward way the original repositories do (B x B x B tensors for Smooth-AP, HAPPIER and
the semi-hard triplet mask, L x B x B for FastAP), timed forward + backward, float32, D = 512,
on the CPU (default) or on a CUDA GPU (`--device cuda`, issue 20).

CPU (each configuration in its own subprocess, for its peak RSS):

    python3 -m venv /work/venv-torch
    /work/venv-torch/bin/pip install torch          # (CPU index unreachable here: PyPI build)
    # correctness cross-check against rankwise (B = 64, float64):
    cargo bench --bench loss_bench -- --check target/losses_check.json
    /work/venv-torch/bin/python benches/losses_vs_torch.py --check target/losses_check.json
    # timings:
    /work/venv-torch/bin/python benches/losses_vs_torch.py --out target/torch_bench.jsonl
    # one configuration:
    /work/venv-torch/bin/python benches/losses_vs_torch.py --one smooth-ap 256
    # markdown table from both JSON-lines files:
    /work/venv-torch/bin/python benches/losses_vs_torch.py --table target/rust_bench.jsonl target/torch_bench.jsonl

GPU (everything in this one process):

    # largest batch per loss, B = 256, 512, ... 16384 until out of memory, <= 6 s per loss (its
    # rows for B = 256, 1024, 4096 are also the fixed-B timings; 30-50 s in all, 60 s at most):
    python3 benches/losses_vs_torch.py --device cuda --max-batch --budget-s 6 --out target/torch_cuda_maxb.jsonl
    # fixed batch sizes only (the CPU grid's rows; out of memory is a row, not a skip):
    python3 benches/losses_vs_torch.py --device cuda --batch 256 --batch 1024 --out target/torch_cuda.jsonl
    # the f64 cross-check on the GPU (a few seconds; the file from `loss_bench -- --check`):
    python3 benches/losses_vs_torch.py --device cuda --check target/losses_check.json

On CUDA each step is bracketed by `torch.cuda.synchronize()`: `--warmup` (2) untimed steps, then
at least `--min-reps` (3) timed ones and more until they add up to `--rep-budget-s` (0.5 s, at
most `--max-reps` 50); the upper median is reported. The peak memory is the caching allocator's
`torch.cuda.max_memory_allocated` after `reset_peak_memory_stats` (the embeddings included, the
CUDA context not). PyTorch's default float32 settings are kept (no TF32 in matmuls) and recorded.
An out-of-memory error (`torch.cuda.OutOfMemoryError`, or a cuBLAS allocation failure) becomes a
row with status "oom"; the memory is freed (`empty_cache`) and the run goes on.

`--max-batch`: for each loss, B = --start (256), 2x, 4x, ... up to --cap (16384) until the first
out-of-memory error; with --budget-s seconds per loss: before each B the previous time is
extrapolated (x8 per doubling for the B^3 losses, x4.5 for the others, times warm-up + min reps)
and the loss stops with status "budget" when that would not fit. Runs on the CPU too (in
process, peak RSS), which is only meant for testing it: `--device cpu --max-batch --start 64 --cap 128`.

JSON lines (printed, and appended to --out). Every in-process/CUDA row: impl "torch", loss, B
(= batch), D, dtype, device, torch, and on CUDA gpu, gpu_total_mib, cuda, matmul_allow_tf32,
float32_matmul_precision (on the CPU: threads); then status "ok" | "oom" | "error" | "budget";
for "ok": reps, warmup, ms_median, seconds (the same median, in s, as the CPU rows), ms_all,
loss_value, peak_mib, peak_kind ("gpu_max_memory_allocated" or "process_peak_rss"); "oom" /
"error": error (the message's first line), peak_mib; "budget": note. --max-batch adds one row per
loss with summary true, max_batch_ok, ms_median_at_max, peak_mib_at_max, stopped ("oom" |
"budget" | "cap" | "error"), first_failed_batch, loss_seconds. The CPU subprocess rows are as
before: B, seconds, seconds_all, reps, loss_value, peak_rss_mib, threads.

Implementations (all take raw embeddings and L2-normalise them first, as rankwise does):

* smooth-ap: Brown et al.'s `SmoothAP.forward` (B x B x B `sim_diff`, sigmoid with the
  exponent clamped to [-50, 50], tau = 0.01, class-contiguous positive blocks of 4), changed
  in one place to match rankwise's default (the paper): the query is excluded from its own
  retrieval and positive sets (the authors' mask removes only j == k; here also j == q, and
  the positive sum runs over k != q and is divided by 3 instead of 4).
* happier: H-AP loss of the authors' `quick_forward` with paper settings (query excluded from
  its own retrieval set, Eq. (4) relevance with alpha = 1 counted without the query,
  continuous H_s^< (tau 0.01, rho 100, delta 0.05, start 0.5), `with_hrank` = True with H_s^>
  (gamma 10, nu 25, mu 0.5), exact Heaviside with H(0) = 1 elsewhere), plus
  0.1 * the normalised-softmax cluster loss (temperature 0.05), total 0.9 * H-AP loss + 0.1 * CE.
* roadmap: ROADMAP's loss as its repository weighs it (`roadmap.yaml`: 1 * SupAP + 1 *
  calibration): SupAP written as the HAPPIER code above with binary relevance (query excluded,
  rank over the negatives through H_s^< with tau 0.01, rho 100, delta 0.05, start 0.5, exact
  Heaviside elsewhere, B x B x B), plus the contrastive calibration loss below (0.9 / 0.6).
* fastap: pytorch-metric-learning's `FastAPLoss` (10 bins, squared L2 distance, L x B x B
  pulse tensor).
* contrastive: pml `ContrastiveLoss` semantics (cosine, pos margin 0.9, neg margin 0.6, each
  term averaged over its non-zero pairs), all-pairs B x B ops.
* triplet-semihard: pml `TripletMarginMiner("semihard")` + `TripletMarginLoss(margin=0.05)`
  with cosine similarity, as one masked B x B x B (anchor, positive, negative) tensor.
* rambo: RaMBO's recall loss, log log, as the authors' `blackbox-backprop` writes it for a
  whole score matrix (`TrueRanker` autograd function: forward `rank_normalised` by two
  argsorts, backward `-(rank - rank(y + lambda * grad)) / lambda`), with rankwise's default
  (the paper) in the three places where their `RecallLoss` departs from it: the query removed
  from its own sequence, per-query averaging, exact counts `rk - rk+`; deterministic margin
  alpha = 0.02, lambda = 4 on normalised ranks, and `/ lambda` without their `+ 1e-8`.
* nsm: the normalised softmax of HAPPIER's `NormSoftmax` loss (cross-entropy of the cosines
  between the normalised embeddings and normalised proxies, temperature 0.05), one proxy per
  class of the batch.
* proxy-nca-pp: ProxyNCA++ as its authors compute it (`euwern/proxynca_pp`, the code HAPPIER's
  authors ran): both the normalised embeddings and the normalised proxies scaled by 3 = sqrt(1/T),
  T = 1/9, their squared distances expanded as |a|^2 + |b|^2 - 2 a.b over the stacked rows and
  clamped at 0, then the cross-entropy of -distance; one proxy per class of the batch.
* proxy-nca: ProxyNCA as Roth & Brattoli re-implement it (`Deep-Metric-Learning-Baselines`,
  the "Proxy NCA†" Smooth-AP ran): the normalised embeddings and proxies scaled by 3, each item's
  squared distance to its own proxy and, stacked per item, to the other classes' proxies, then
  mean(d_own + logsumexp(-d_others)); proxies N(0, 1) / 8, one per class of the batch.
* csl: CSL as HAPPIER's authors write it (`csl_loss.py`): s = 32, margins 0.25 / 0.45 for the
  fine and coarse levels; at each level softplus(logsumexp over the other classes' proxies of
  s * cos - s * cos(own proxy) + s * margin), averaged over the batch, summed over the levels;
  one proxy per fine class of the batch.
"""
import argparse
import gc
import json
import math
import os
import subprocess
import sys
import time

import torch

DIM = 512
LOSSES = ["smooth-ap", "happier", "roadmap", "fastap", "rambo", "contrastive", "triplet-semihard",
          "nsm", "proxy-nca-pp", "proxy-nca", "csl"]
BATCHES = [128, 256, 384, 1024, 4096]
# B^3-sized f32 tensors' worth of memory at the peak of forward + backward, from the peak RSS
# measured at B = 384 minus the ~516 MiB of `import torch` (9.1, 9.7 and 4.6), rounded up; a
# configuration is skipped when count * B^3 * 4 bytes exceeds the limit.
CUBE_TENSORS = {"smooth-ap": 10, "happier": 10, "roadmap": 10, "triplet-semihard": 5}
LIMIT_GB = 12.0
TIME_BUDGET_S = 1.0
MAX_REPS = 200


def peak_rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def labels(b):
    fine = torch.arange(b) // 4
    coarse = fine % 2
    return fine, coarse


# ---------------------------------------------------------------- Smooth-AP (Brown et al.)
def sigmoid(tensor, temp=1.0):
    exponent = -tensor / temp
    exponent = torch.clamp(exponent, min=-50, max=50)
    return 1.0 / (1.0 + torch.exp(exponent))


def smooth_ap(emb, fine, tau=0.01, group=4):
    preds = torch.nn.functional.normalize(emb, dim=1)
    b, d = preds.shape
    num_id = b // group
    dev, dt = preds.device, preds.dtype
    # query excluded: mask[q, k, j] = (j != k) & (j != q)
    eye = torch.eye(b, device=dev, dtype=dt)
    mask = (1.0 - eye).unsqueeze(0).repeat(b, 1, 1) * (1.0 - eye).unsqueeze(1)
    sim_all = preds @ preds.t()
    sim_all_repeat = sim_all.unsqueeze(dim=1).repeat(1, b, 1)
    sim_diff = sim_all_repeat - sim_all_repeat.permute(0, 2, 1)
    sim_sg = sigmoid(sim_diff, temp=tau) * mask
    sim_all_rk = torch.sum(sim_sg, dim=-1) + 1
    xs = preds.view(num_id, group, d)
    geye = torch.eye(group, device=dev, dtype=dt)
    pos_mask = ((1.0 - geye).unsqueeze(0) * (1.0 - geye).unsqueeze(1)).unsqueeze(0).repeat(num_id, 1, 1, 1)
    sim_pos = torch.bmm(xs, xs.permute(0, 2, 1))
    sim_pos_repeat = sim_pos.unsqueeze(dim=2).repeat(1, 1, group, 1)
    sim_pos_diff = sim_pos_repeat - sim_pos_repeat.permute(0, 1, 3, 2)
    sim_pos_sg = sigmoid(sim_pos_diff, temp=tau) * pos_mask
    sim_pos_rk = torch.sum(sim_pos_sg, dim=-1) + 1
    offdiag = 1.0 - geye
    ap = torch.zeros((), device=dev, dtype=dt)
    for ind in range(num_id):
        blk = slice(ind * group, (ind + 1) * group)
        pos_divide = torch.sum(offdiag * sim_pos_rk[ind] / sim_all_rk[blk, blk])
        ap = ap + (pos_divide / (group - 1)) / b
    return 1 - ap


# ---------------------------------------------------------------- HAPPIER (quick_forward)
def heaviside(t):
    # torch.heaviside(t, values=1) as in the authors' code (no gradient: exact step); torch
    # has no derivative for aten::heaviside, so the comparison is written out.
    return (t >= 0).to(t.dtype)


def step_rank(t, tau=0.01, rho=100.0, delta=0.05, start=0.5):
    offset = 1.0 / (1.0 + math.exp(-delta / tau)) + start
    sig = torch.sigmoid(t / tau)
    return torch.where(t <= 0, sig, torch.where(t <= delta, sig + start, rho * (t - delta) + offset))


def step_hrank(t, gamma=10.0, nu=25.0, mu=0.5):
    return torch.where(t < 0, gamma * t, torch.clamp(nu * t + mu, max=1.0))


def happier(emb, fine, coarse, proxies, alpha=1.0, lam=0.1, temperature=0.05):
    v = torch.nn.functional.normalize(emb, dim=1)
    b = v.shape[0]
    num_levels = 2
    scores = v @ v.t()
    lvl = (fine[:, None] == fine[None, :]).long() + (coarse[:, None] == coarse[None, :]).long()
    eye = torch.eye(b, dtype=torch.bool, device=v.device)
    # relevance (Eq. 4, paper: the query not counted): (l/L)^alpha / |Omega^(l)|
    counts = torch.stack([((lvl == l) & ~eye).sum(1) for l in range(num_levels + 1)], 1)
    w = (torch.arange(num_levels + 1, dtype=v.dtype, device=v.device) / num_levels) ** alpha
    rel = w[lvl] / counts.gather(1, lvl).clamp(min=1).to(v.dtype)
    rel = rel.masked_fill(eye, 0.0)
    # t[q, k, j] = s[q, j] - s[q, k]
    t = scores.unsqueeze(1) - scores.unsqueeze(2)
    lvl_k = lvl.unsqueeze(2)
    lvl_j = lvl.unsqueeze(1)
    valid = (~torch.eye(b, dtype=torch.bool, device=v.device)).unsqueeze(0) & (~eye).unsqueeze(1)  # j != k, j != q
    h = heaviside(t)
    rank_terms = torch.where(lvl_j < lvl_k, step_rank(t), h) * valid
    hrank_terms = torch.where(lvl_j > lvl_k, step_hrank(t), h) * valid
    min_rel = torch.minimum(rel.unsqueeze(2), rel.unsqueeze(1))
    rank = 1.0 + rank_terms.sum(-1)
    hrank = rel + (hrank_terms * min_rel).sum(-1)
    pos = rel > 0
    hap = (torch.where(pos, hrank / rank, torch.zeros_like(rank))).sum(1) / rel.sum(1)
    has_pos = pos.any(1)
    hap_loss = (1.0 - hap[has_pos]).mean()
    logits = v @ torch.nn.functional.normalize(proxies, dim=1).t() / temperature
    ce = torch.nn.functional.cross_entropy(logits, fine)
    return (1 - lam) * hap_loss + lam * ce


# ---------------------------------------------------------------- FastAP (pml FastAPLoss)
def fastap(emb, fine, num_bins=10):
    e = torch.nn.functional.normalize(emb, dim=1)
    n = e.shape[0]
    same = fine[:, None] == fine[None, :]
    eye = torch.eye(n, dtype=torch.bool, device=e.device)
    i_pos = (same & ~eye).to(e.dtype)
    i_neg = (~same).to(e.dtype)
    n_pos = i_pos.sum(1)
    safe_n = n_pos > 0
    dist_mat = torch.cdist(e, e) ** 2
    histogram_max = 4.0
    delta = histogram_max / num_bins
    mid_points = torch.linspace(0.0, histogram_max, steps=num_bins + 1, dtype=e.dtype, device=e.device).view(-1, 1, 1)
    pulse = torch.nn.functional.relu(1 - torch.abs(dist_mat - mid_points) / delta)
    pos_hist = torch.t(torch.sum(pulse * i_pos, dim=2))
    neg_hist = torch.t(torch.sum(pulse * i_neg, dim=2))
    total_pos_hist = torch.cumsum(pos_hist, dim=1)
    total_hist = torch.cumsum(pos_hist + neg_hist, dim=1)
    h_pos_product = pos_hist * total_pos_hist
    safe_h = (h_pos_product > 0) & (total_hist > 0)
    fast_ap = torch.zeros_like(pos_hist)
    fast_ap[safe_h] = h_pos_product[safe_h] / total_hist[safe_h]
    fast_ap = torch.sum(fast_ap, dim=1)
    fast_ap = fast_ap[safe_n] / n_pos[safe_n]
    return torch.mean(1 - fast_ap)


# ---------------------------------------------------------------- contrastive, triplet
def avg_nonzero(x, mask):
    nz = (x > 0) & mask
    cnt = nz.sum()
    return (x * nz).sum() / cnt if cnt > 0 else x.sum() * 0


def contrastive(emb, fine, pos_margin=0.9, neg_margin=0.6):
    e = torch.nn.functional.normalize(emb, dim=1)
    s = e @ e.t()
    same = fine[:, None] == fine[None, :]
    eye = torch.eye(s.shape[0], dtype=torch.bool, device=s.device)
    pos = same & ~eye
    neg = ~same
    return avg_nonzero(torch.relu(pos_margin - s), pos) + avg_nonzero(torch.relu(s - neg_margin), neg)


def triplet_semihard(emb, fine, margin=0.05):
    e = torch.nn.functional.normalize(emb, dim=1)
    s = e @ e.t()
    same = fine[:, None] == fine[None, :]
    eye = torch.eye(s.shape[0], dtype=torch.bool, device=s.device)
    pos = same & ~eye
    neg = ~same
    d = s.unsqueeze(2) - s.unsqueeze(1)  # [a, p, n] = s_ap - s_an
    semihard = pos.unsqueeze(2) & neg.unsqueeze(1) & (d > 0) & (d <= margin)
    cost = torch.relu(margin - d)
    return avg_nonzero(cost, semihard)


# ---------------------------------------------------------------- ROADMAP (SupAP + calibration)
def sup_ap(emb, fine):
    v = torch.nn.functional.normalize(emb, dim=1)
    b = v.shape[0]
    scores = v @ v.t()
    eye = torch.eye(b, dtype=torch.bool, device=v.device)
    pos = (fine[:, None] == fine[None, :]) & ~eye
    # t[q, k, j] = s[q, j] - s[q, k]; j != k and j != q
    t = scores.unsqueeze(1) - scores.unsqueeze(2)
    valid = (~eye).unsqueeze(0) & (~eye).unsqueeze(1)
    pos_k, pos_j = pos.unsqueeze(2), pos.unsqueeze(1)
    h = heaviside(t)
    rank = 1.0 + (torch.where(pos_k & ~pos_j, step_rank(t), h) * valid).sum(-1)
    rank_pos = 1.0 + (h * (pos_j & valid)).sum(-1)
    ap = torch.where(pos, rank_pos / rank, torch.zeros_like(rank)).sum(1) / pos.sum(1).clamp(min=1)
    has_pos = pos.any(1)
    return (1.0 - ap[has_pos]).mean()


def roadmap(emb, fine):
    return sup_ap(emb, fine) + contrastive(emb, fine)


# ---------------------------------------------------------------- proxy losses (HAPPIER's baselines)
def nsm(emb, fine, proxies, temperature=0.05):
    v = torch.nn.functional.normalize(emb, dim=1)
    logits = v @ torch.nn.functional.normalize(proxies, dim=1).t() / temperature
    return torch.nn.functional.cross_entropy(logits, fine)


def proxy_nca_pp(emb, fine, proxies, temperature=1.0 / 9.0):
    scale = math.sqrt(1.0 / temperature)
    x = scale * torch.nn.functional.normalize(emb, dim=1)
    p = scale * torch.nn.functional.normalize(proxies, dim=1)
    rows = torch.cat([x, p])
    sq = rows.pow(2).sum(1)
    dist = (sq[:, None] + sq[None, :] - 2.0 * rows @ rows.t()).clamp(min=0.0)
    dist = dist[: x.shape[0], x.shape[0]:]
    return torch.nn.functional.cross_entropy(-dist, fine)


def proxy_nca(emb, fine, proxies, scale=3.0):
    x = scale * torch.nn.functional.normalize(emb, dim=1)
    p = scale * torch.nn.functional.normalize(proxies, dim=1)
    # Per item, the other classes' proxies in class order (C - 1 each), as the re-implementation
    # stacks them (its per-item Python loop, vectorised: index k skips the item's own class).
    k = torch.arange(p.shape[0] - 1, device=emb.device)[None, :]
    others = k + (k >= fine[:, None]).long()
    d_own = (x - p[fine]).pow(2).sum(1)
    d_others = (x[:, None, :] - p[others]).pow(2).sum(-1)
    return (d_own + torch.logsumexp(-d_others, dim=1)).mean()


def csl(emb, fine, coarse, proxies, scale=32.0, margins=(0.25, 0.45)):
    """Proxy c is fine class c (the batch's classes are 0..C-1); its coarse class is c's."""
    v = torch.nn.functional.normalize(emb, dim=1)
    logits = scale * (v @ torch.nn.functional.normalize(proxies, dim=1).t())
    c = proxies.shape[0]
    proxy_fine = torch.arange(c, device=emb.device)
    proxy_coarse = torch.zeros(c, dtype=coarse.dtype, device=emb.device).scatter_(0, fine, coarse)
    own = logits.gather(1, fine[:, None]).squeeze(1)
    total = 0.0
    for level, (item, proxy) in enumerate([(fine, proxy_fine), (coarse, proxy_coarse)]):
        negative = item[:, None] != proxy[None, :]
        lse = torch.logsumexp(logits.masked_fill(~negative, float("-inf")), dim=1)
        total = total + torch.nn.functional.softplus(lse - own + margins[level] * scale).mean()
    return total


# ---------------------------------------------------------------- RaMBO (blackbox-backprop)
def rank_normalised(seq):
    """1-based descending ranks along dim 1, divided by the sequence length."""
    return (torch.argsort(torch.argsort(seq, dim=1, descending=True), dim=1) + 1).to(seq.dtype) / seq.shape[1]


class TrueRanker(torch.autograd.Function):
    @staticmethod
    def forward(ctx, seq, lambda_val):
        rank = rank_normalised(seq)
        ctx.lambda_val = lambda_val
        ctx.save_for_backward(seq, rank)
        return rank

    @staticmethod
    def backward(ctx, grad_output):
        seq, rank = ctx.saved_tensors
        rank_prime = rank_normalised(seq + ctx.lambda_val * grad_output)
        return -(rank - rank_prime) / ctx.lambda_val, None


def rambo(emb, fine, lambda_val=4.0, margin=0.02):
    e = torch.nn.functional.normalize(emb, dim=1)
    s = e @ e.t()
    n = s.shape[0]
    off = ~torch.eye(n, dtype=torch.bool, device=s.device)
    seq = s[off].view(n, n - 1)  # the query removed from its own sequence
    rel = (fine[:, None] == fine[None, :])[off].view(n, n - 1)
    shifted = seq - margin * (rel.to(seq.dtype) - 0.5)
    ranks = TrueRanker.apply(shifted, lambda_val) * (n - 1)  # integer ranks, differentiable
    with torch.no_grad():  # rank among the relevant items: a constant
        only_rel = torch.where(rel, shifted, torch.full_like(shifted, -math.inf))
        ranks_pos = (torch.argsort(torch.argsort(only_rel, dim=1, descending=True), dim=1) + 1).to(seq.dtype)
    r = torch.where(rel, ranks - ranks_pos, torch.zeros_like(ranks))
    per_item = torch.log1p(torch.log1p(r)) * rel
    num_pos = rel.sum(1)
    has = num_pos > 0
    return (per_item.sum(1)[has] / num_pos[has]).mean()


# ---------------------------------------------------------------- timing
def make_case(name, b, device="cpu"):
    """The embeddings (B x D, float32) and the loss closure of one configuration. The random
    numbers are drawn on the CPU (same seed, same order on every device) and then moved, so a
    CUDA run sees the same embeddings, labels and proxies as a CPU run."""
    torch.manual_seed(0)
    data = torch.randn(b, DIM, dtype=torch.float32)
    fine, coarse = labels(b)
    proxies = None
    if name in ("happier", "nsm", "csl", "proxy-nca-pp", "proxy-nca"):
        nclass = int(fine.max()) + 1
        if name in ("proxy-nca-pp", "proxy-nca"):  # the authors' draw, N(0, 1) / 8
            proxies = torch.randn(nclass, DIM) / 8
        else:
            proxies = torch.empty(nclass, DIM).uniform_(-1 / math.sqrt(DIM), 1 / math.sqrt(DIM))
    # `.to("cpu")` of a CPU tensor is the tensor itself: the CPU path is as before.
    data, fine, coarse = data.to(device), fine.to(device), coarse.to(device)
    if proxies is not None:
        proxies = proxies.to(device).requires_grad_()
    fns = {
        "smooth-ap": lambda e: smooth_ap(e, fine),
        "happier": lambda e: happier(e, fine, coarse, proxies),
        "roadmap": lambda e: roadmap(e, fine),
        "fastap": lambda e: fastap(e, fine),
        "rambo": lambda e: rambo(e, fine),
        "contrastive": lambda e: contrastive(e, fine),
        "triplet-semihard": lambda e: triplet_semihard(e, fine),
        "nsm": lambda e: nsm(e, fine, proxies),
        "proxy-nca-pp": lambda e: proxy_nca_pp(e, fine, proxies),
        "proxy-nca": lambda e: proxy_nca(e, fine, proxies),
        "csl": lambda e: csl(e, fine, coarse, proxies),
    }
    return data, fns[name]


def run_one(name, b, reps):
    """One CPU configuration, run in its own process by `main` (for its peak RSS)."""
    data, fn = make_case(name, b)
    reset_peak_rss()
    times = []
    value = float("nan")
    # As the Rust side: `reps` timed steps when given, else at least default_reps(b) and more
    # until they add up to TIME_BUDGET_S (at most MAX_REPS), for the steady state.
    min_reps, max_reps = (reps, reps) if reps else (default_reps(b), MAX_REPS)
    rep = 0
    while len(times) < min_reps or (len(times) < max_reps and sum(times) < TIME_BUDGET_S):
        emb = data.clone().requires_grad_()
        t0 = time.perf_counter()
        loss = fn(emb)
        loss.backward()
        _ = float(emb.grad.sum())
        dt = time.perf_counter() - t0
        value = float(loss.detach())
        if rep > 0:
            times.append(dt)
        rep += 1
    return {
        "impl": "torch",
        "torch": torch.__version__,
        "loss": name,
        "B": b,
        "D": DIM,
        "threads": torch.get_num_threads(),
        "reps": len(times),
        # the upper median, as the Rust side (with 2 steps, the slower one)
        "seconds": sorted(times)[len(times) // 2],
        "seconds_all": times,
        "loss_value": value,
        "peak_rss_mib": peak_rss_mib(),
    }


# ---------------------------------------------------------------- in-process timing (CUDA)
# On CUDA every configuration runs in this one process: the peak memory is the caching
# allocator's own counter (reset per configuration), so no subprocess is needed, and the CUDA
# context (seconds to create) is paid once. `--device cpu` with `--max-batch` uses the same
# code (peak RSS as `VmHWM` after a reset), to test it without a GPU.


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def reset_peak(dev):
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    else:
        reset_peak_rss()


def peak_mib(dev):
    """(peak, what it measures): the caching allocator's peak of allocated bytes on CUDA, the
    process's peak RSS on the CPU."""
    if dev.type == "cuda":
        return torch.cuda.max_memory_allocated(dev) / 2**20, "gpu_max_memory_allocated"
    return peak_rss_mib(), "process_peak_rss"


def free_memory(dev):
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def is_oom(exc):
    """Out of memory, whichever layer noticed: the caching allocator
    (`torch.cuda.OutOfMemoryError`), cuBLAS/cuDNN workspaces, or the CPU allocator."""
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    msg = str(exc)
    return any(s in msg for s in ("out of memory", "ALLOC_FAILED", "can't allocate memory"))


def device_info(dev):
    """Fields common to every CUDA row: the GPU, the versions and the float32 math settings
    (PyTorch's defaults are left as they are: no TF32 in matmuls, TF32 in cuDNN convolutions)."""
    info = {"device": dev.type, "torch": torch.__version__}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        info.update({
            "gpu": torch.cuda.get_device_name(dev),
            "gpu_total_mib": round(props.total_memory / 2**20),
            "cuda": torch.version.cuda,
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
        })
    else:
        info["threads"] = torch.get_num_threads()
    return info


def time_inprocess(name, b, dev, warmup, min_reps, max_reps, rep_budget_s, deadline):
    """Forward + backward of one configuration in this process: `warmup` untimed steps, then
    at least `min_reps` timed ones and more until they add up to `rep_budget_s` (at most
    `max_reps`; none beyond `min_reps` once `deadline`, a `time.perf_counter()` value, has
    passed). Each step is bracketed by `torch.cuda.synchronize()`, so it times the GPU work,
    not its launch."""
    data, fn = make_case(name, b, dev)
    sync(dev)
    reset_peak(dev)

    def step():
        emb = data.clone().requires_grad_()
        sync(dev)
        t0 = time.perf_counter()
        loss = fn(emb)
        loss.backward()
        sync(dev)
        return time.perf_counter() - t0, loss

    for _ in range(warmup):
        _, loss = step()
    times = []
    while len(times) < min_reps or (
        len(times) < max_reps and sum(times) < rep_budget_s and time.perf_counter() < deadline
    ):
        dt, loss = step()
        times.append(dt)
    value = float(loss.detach())
    peak, peak_kind = peak_mib(dev)
    med = sorted(times)[len(times) // 2]  # the upper median, as in `run_one`
    return {
        "status": "ok",
        "reps": len(times),
        "warmup": warmup,
        "ms_median": med * 1e3,
        "seconds": med,
        "ms_all": [t * 1e3 for t in times],
        "loss_value": value,
        "peak_mib": peak,
        "peak_kind": peak_kind,
    }


def attempt(name, b, dev, args, deadline=math.inf):
    """`time_inprocess` as one JSON-ready row; an out-of-memory error gives status "oom" (and
    any other error status "error") instead of an exception, with the memory freed."""
    row = {"impl": "torch", "loss": name, "B": b, "batch": b, "D": DIM, "dtype": "float32"}
    row.update(device_info(dev))
    failure = None
    try:
        row.update(time_inprocess(name, b, dev, args.warmup, args.min_reps, args.max_reps,
                                  args.rep_budget_s, deadline))
    except Exception as exc:  # noqa: BLE001 -- any failure becomes a row
        failure = ("oom" if is_oom(exc) else "error",
                   f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}")
        peak, peak_kind = peak_mib(dev)
        row.update({"peak_mib": peak, "peak_kind": peak_kind})
    # Outside the `except` block: the exception, its traceback and the tensors its frames held
    # are gone, so the cached blocks can really be released.
    free_memory(dev)
    if failure:
        row["status"], row["error"] = failure
    return row


def growth(name):
    """How much slower a step gets when B doubles, for the budget forecast: 8 for the losses
    with B x B x B tensors, 4.5 for the B x B ones (4 x the work, a little more for sorting)."""
    return 8.0 if name in CUBE_TENSORS else 4.5


def op_floor(dev, ops=2000, rounds=5):
    """The time of one elementwise operation on a 1-value tensor, out of place (as rankwise's
    candle ops allocate their output), median of `rounds` runs of `ops` chained operations:
    the floor under which a loss at a small batch, launch-bound, cannot go per operation."""
    x = torch.zeros(1, device=dev)
    for _ in range(50):
        x = x * 1.0
    per = []
    for _ in range(rounds):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(ops):
            x = x * 1.0
        if dev.type == "cuda":
            torch.cuda.synchronize()
        per.append((time.perf_counter() - t) / ops * 1e6)
    return sorted(per)[len(per) // 2]


def max_batch(args, dev, emit):
    """For each loss, B = start, 2 start, ... up to --cap until the first out-of-memory error,
    within --budget-s seconds per loss: before each B the time of the previous one is
    extrapolated (x growth(loss) per doubling, times warm-up + minimum reps) and the loss stops
    with status "budget" if that would not fit in what is left of its budget. One row per
    (loss, B), then one summary row per loss (`"summary": true`): the largest B that ran, its
    median time and why the doubling stopped (oom / budget / cap / error)."""
    for name in args.loss or LOSSES:
        t_start = time.perf_counter()
        deadline = t_start + args.budget_s
        best, stopped, last_s, b = None, "cap", None, args.start
        while b <= args.cap:
            left = deadline - time.perf_counter()
            forecast = None if last_s is None else last_s * growth(name) * (args.warmup + args.min_reps)
            if left <= 0 or (forecast is not None and forecast > left):
                row = {"impl": "torch", "loss": name, "B": b, "batch": b, "D": DIM,
                       "dtype": "float32", **device_info(dev), "status": "budget",
                       "note": f"stopped: budget (forecast {forecast or 0:.2f} s, {max(left, 0):.2f} s left "
                               f"of --budget-s {args.budget_s})"}
                emit(row)
                stopped = "budget"
                break
            row = attempt(name, b, dev, args, deadline)
            emit(row)
            if row["status"] != "ok":
                stopped = row["status"]
                break
            best, last_s = row, row["seconds"]
            b *= 2
        emit({
            "impl": "torch", "summary": True, "loss": name, **device_info(dev),
            "max_batch_ok": best["B"] if best else None,
            "ms_median_at_max": best["ms_median"] if best else None,
            "peak_mib_at_max": best["peak_mib"] if best else None,
            "stopped": stopped,
            "first_failed_batch": b if stopped in ("oom", "error") else None,
            "loss_seconds": round(time.perf_counter() - t_start, 2),
        })


def default_reps(b):
    return 5 if b <= 384 else (3 if b <= 1024 else 2)


def needed_gb(name, b):
    if name == "proxy-nca":
        # The re-implementation's B x (C - 1) x D differences (C = B / 4), about four such
        # f32 tensors at the peak (differences, squares and their gradients).
        return 4 * b * (b // 4) * DIM * 4 / 1e9
    return CUBE_TENSORS.get(name, 0) * b**3 * 4 / 1e9


def check(path, dev=torch.device("cpu")):
    """Our values and gradients (f64, B = 64) against these implementations: the values must
    agree to 1e-10; the gradients' largest difference is reported. Runs on --device (CUDA has
    float64 too; its reductions are ordered differently, well within the tolerance)."""
    with open(path) as f:
        ref = json.load(f)
    b, d = ref["B"], ref["D"]
    fine = torch.tensor(ref["fine"], device=dev)
    coarse = torch.tensor(ref["coarse"], device=dev) if "coarse" in ref else None

    def proxies(key):
        # Our proxies (one per fine class, in class order), as the loss was given them.
        p = torch.tensor(ref[key + "_proxies"], dtype=torch.float64, device=dev)
        return p.view(-1, d)

    failed = 0
    checks = [("smooth-ap", "smooth_ap", smooth_ap), ("roadmap", "roadmap", roadmap), ("rambo", "rambo", rambo),
              ("nsm", "nsm", lambda e, f: nsm(e, f, proxies("nsm"))),
              ("proxy-nca-pp", "proxy_nca_pp", lambda e, f: proxy_nca_pp(e, f, proxies("proxy_nca_pp"))),
              ("proxy-nca", "proxy_nca", lambda e, f: proxy_nca(e, f, proxies("proxy_nca"))),
              ("csl", "csl", lambda e, f: csl(e, f, coarse, proxies("csl")))]
    for name, key, fn in checks:
        if key + "_loss" not in ref:
            continue
        emb = torch.tensor(ref["embeddings"], dtype=torch.float64, device=dev).view(b, d).requires_grad_()
        loss = fn(emb, fine)
        loss.backward()
        ours = ref[key + "_loss"]
        g_ref = torch.tensor(ref[key + "_grad"], dtype=torch.float64, device=dev).view(b, d)
        value = float(loss.detach())
        diff = abs(value - ours)
        gdiff = float((emb.grad - g_ref).abs().max())
        print(json.dumps({
            "check": name, "B": b, "dtype": "float64", "device": dev.type,
            "torch_loss": value, "rankwise_loss": ours, "abs_diff": diff,
            "grad_max_abs_diff": gdiff, "grad_max_abs": float(g_ref.abs().max()),
            "pass_1e-10": diff <= 1e-10,
        }))
        failed += diff > 1e-10
    return 1 if failed else 0


def table(rust_path, torch_path):
    """Markdown table of two JSON-lines files (CPU rows: `peak_rss_mib`; in-process/CUDA rows:
    `peak_mib` and a `status`; summary rows are left out)."""
    def load(p):
        rows = {}
        with open(p) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    r = json.loads(line)
                    if "B" in r and not r.get("summary"):
                        rows[(r["loss"], r["B"])] = r
        return rows

    def mem(r):
        m = r.get("peak_rss_mib", r.get("peak_mib"))
        return "—" if m is None else f"{m:.0f}"

    def mem_label(rows):
        return "peak GPU" if any(r.get("device") == "cuda" for r in rows.values()) else "peak RSS"

    rust, tch = load(rust_path), load(torch_path)
    print(f"| loss | B | rankwise s | torch s | torch / rankwise | rankwise {mem_label(rust)} (MiB) "
          f"| torch {mem_label(tch)} (MiB) |")
    print("|---|---|---|---|---|---|---|")
    batches = sorted({b for _, b in rust} | {b for _, b in tch})
    for name in LOSSES:
        for b in batches:
            r, t = rust.get((name, b)), tch.get((name, b))
            if r is None and t is None:
                continue
            rs = f"{r['seconds']:.4g}" if r and "seconds" in r else "—"
            rm = mem(r) if r else "—"
            if t is None:
                ts, tm, ratio = "—", "—", "—"
            elif "skipped" in t:
                ts, tm, ratio = t["skipped"], "—", "—"
            elif t.get("status", "ok") != "ok":
                ts, tm, ratio = t["status"], "—", "—"
            else:
                ts, tm = f"{t['seconds']:.4g}", mem(t)
                ratio = f"{t['seconds'] / r['seconds']:.1f}×" if r and r.get("seconds") else "—"
            print(f"| {name} | {b} | {rs} | {ts} | {ratio} | {rm} | {tm} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", nargs=2, metavar=("LOSS", "B"), help="one CPU configuration (used by the subprocess loop)")
    ap.add_argument("--loss", action="append", choices=LOSSES, help="repeatable; default: all")
    ap.add_argument("--batch", action="append", type=int, help="repeatable; default: %s" % BATCHES)
    ap.add_argument("--reps", type=int, help="CPU: exact number of timed reps")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--out", help="append the JSON lines to this file (they are printed too)")
    ap.add_argument("--check", metavar="JSON", help="float64 cross-check against rankwise's file")
    ap.add_argument("--table", nargs=2, metavar=("RUST_JSONL", "TORCH_JSONL"))
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda / cuda:N")
    # in-process timing (always on CUDA; on the CPU with --max-batch)
    ap.add_argument("--warmup", type=int, default=2, help="in-process: untimed steps first (default 2)")
    ap.add_argument("--min-reps", type=int, default=3, help="in-process: at least this many timed steps (default 3)")
    ap.add_argument("--max-reps", type=int, default=50, help="in-process: at most this many (default 50)")
    ap.add_argument("--rep-budget-s", type=float, default=0.5,
                    help="in-process: timed steps beyond --min-reps until they add up to this (default 0.5 s)")
    ap.add_argument("--max-batch", action="store_true",
                    help="double B from --start up to --cap until out of memory or --budget-s")
    ap.add_argument("--start", type=int, default=256, help="--max-batch: first B (default 256)")
    ap.add_argument("--cap", type=int, default=16384, help="--max-batch: largest B tried (default 16384)")
    ap.add_argument("--budget-s", type=float, default=10.0, help="--max-batch: seconds per loss (default 10)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            print("losses_vs_torch.py: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
            return 2
        # Create the CUDA context and cuBLAS handle now, outside every timing and budget.
        x = torch.randn(64, 64, device=dev)
        (x @ x).sum().item()
    if args.check:
        return check(args.check, dev)
    if args.table:
        return table(*args.table)
    if args.one:
        name, b = args.one[0], int(args.one[1])
        print(json.dumps(run_one(name, b, args.reps)), flush=True)
        return 0
    out = open(args.out, "a") if args.out else None

    def emit(row):
        # The end time lets scripts/gpu_check.sh read the device memory (nvidia-smi) of the
        # window between two rows, the same measure as for rankwise.
        line = json.dumps({**row, "unix_end_ms": int(time.time() * 1000)})
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    if args.max_batch:
        emit({"impl": "torch", "kind": "op_floor", "device": str(dev), "us_per_op": round(op_floor(dev), 3)})
        max_batch(args, dev, emit)
        return 0
    if dev.type == "cuda":
        # The --batch grid, every configuration in this process; out of memory is a row.
        for b in args.batch or BATCHES:
            for name in args.loss or LOSSES:
                emit(attempt(name, b, dev, args))
        return 0
    for b in args.batch or BATCHES:
        for name in args.loss or LOSSES:
            gb = needed_gb(name, b)
            if gb > LIMIT_GB:
                line = json.dumps({"impl": "torch", "loss": name, "B": b,
                                   "skipped": f"OOM/skipped: needs ≈{gb:.0f} GB"})
                print(f"{name} B={b}: OOM/skipped: needs ≈{gb:.0f} GB "
                      f"({CUBE_TENSORS[name]} B³ f32 tensors)", flush=True)
            else:
                cmd = [sys.executable, os.path.abspath(__file__), "--one", name, str(b),
                       "--threads", str(args.threads)]
                if args.reps:
                    cmd += ["--reps", str(args.reps)]
                res = subprocess.run(cmd, capture_output=True, text=True)
                if res.returncode != 0:
                    line = json.dumps({"impl": "torch", "loss": name, "B": b,
                                       "skipped": f"failed (rc {res.returncode})"})
                    print(res.stderr[-2000:], file=sys.stderr)
                else:
                    line = res.stdout.strip().splitlines()[-1]
                print(line, flush=True)
            if out:
                out.write(line + "\n")
                out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
