#!/usr/bin/env python3
"""Issue 3 losses benchmark, PyTorch side: the same formulas as rankwise, written the
straightforward way the original repositories do (B x B x B tensors for Smooth-AP, HAPPIER and
the semi-hard triplet mask, L x B x B for FastAP), timed forward + backward on the CPU.

    python3 -m venv /work/venv-torch
    /work/venv-torch/bin/pip install torch          # (CPU index unreachable here: PyPI build)
    # correctness cross-check against rankwise (B = 64, float64):
    cargo bench --bench loss_bench -- --check target/losses_check.json
    /work/venv-torch/bin/python benches/losses_vs_torch.py --check target/losses_check.json
    # timings (each configuration in its own subprocess, for its peak RSS):
    /work/venv-torch/bin/python benches/losses_vs_torch.py --out target/torch_bench.jsonl
    # one configuration:
    /work/venv-torch/bin/python benches/losses_vs_torch.py --one smooth-ap 256
    # markdown table from both JSON-lines files:
    /work/venv-torch/bin/python benches/losses_vs_torch.py --table target/rust_bench.jsonl target/torch_bench.jsonl

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
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch

DIM = 512
LOSSES = ["smooth-ap", "happier", "roadmap", "fastap", "rambo", "contrastive", "triplet-semihard"]
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
    eye = torch.eye(b, dtype=torch.bool)
    # relevance (Eq. 4, paper: the query not counted): (l/L)^alpha / |Omega^(l)|
    counts = torch.stack([((lvl == l) & ~eye).sum(1) for l in range(num_levels + 1)], 1)
    w = (torch.arange(num_levels + 1, dtype=v.dtype) / num_levels) ** alpha
    rel = w[lvl] / counts.gather(1, lvl).clamp(min=1).to(v.dtype)
    rel = rel.masked_fill(eye, 0.0)
    # t[q, k, j] = s[q, j] - s[q, k]
    t = scores.unsqueeze(1) - scores.unsqueeze(2)
    lvl_k = lvl.unsqueeze(2)
    lvl_j = lvl.unsqueeze(1)
    valid = (~torch.eye(b, dtype=torch.bool)).unsqueeze(0) & (~eye).unsqueeze(1)  # j != k, j != q
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
    eye = torch.eye(n, dtype=torch.bool)
    i_pos = (same & ~eye).to(e.dtype)
    i_neg = (~same).to(e.dtype)
    n_pos = i_pos.sum(1)
    safe_n = n_pos > 0
    dist_mat = torch.cdist(e, e) ** 2
    histogram_max = 4.0
    delta = histogram_max / num_bins
    mid_points = torch.linspace(0.0, histogram_max, steps=num_bins + 1, dtype=e.dtype).view(-1, 1, 1)
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
    eye = torch.eye(s.shape[0], dtype=torch.bool)
    pos = same & ~eye
    neg = ~same
    return avg_nonzero(torch.relu(pos_margin - s), pos) + avg_nonzero(torch.relu(s - neg_margin), neg)


def triplet_semihard(emb, fine, margin=0.05):
    e = torch.nn.functional.normalize(emb, dim=1)
    s = e @ e.t()
    same = fine[:, None] == fine[None, :]
    eye = torch.eye(s.shape[0], dtype=torch.bool)
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
    eye = torch.eye(b, dtype=torch.bool)
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
    off = ~torch.eye(n, dtype=torch.bool)
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
def run_one(name, b, reps):
    torch.manual_seed(0)
    data = torch.randn(b, DIM, dtype=torch.float32)
    fine, coarse = labels(b)
    proxies = None
    if name == "happier":
        nclass = int(fine.max()) + 1
        proxies = torch.empty(nclass, DIM).uniform_(-1 / math.sqrt(DIM), 1 / math.sqrt(DIM)).requires_grad_()
    fns = {
        "smooth-ap": lambda e: smooth_ap(e, fine),
        "happier": lambda e: happier(e, fine, coarse, proxies),
        "roadmap": lambda e: roadmap(e, fine),
        "fastap": lambda e: fastap(e, fine),
        "rambo": lambda e: rambo(e, fine),
        "contrastive": lambda e: contrastive(e, fine),
        "triplet-semihard": lambda e: triplet_semihard(e, fine),
    }
    fn = fns[name]
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


def default_reps(b):
    return 5 if b <= 384 else (3 if b <= 1024 else 2)


def needed_gb(name, b):
    return CUBE_TENSORS.get(name, 0) * b**3 * 4 / 1e9


def check(path):
    """Our values and gradients (f64, B = 64) against these implementations: the values must
    agree to 1e-10; the gradients' largest difference is reported."""
    with open(path) as f:
        ref = json.load(f)
    b, d = ref["B"], ref["D"]
    fine = torch.tensor(ref["fine"])
    failed = 0
    checks = [("smooth-ap", "smooth_ap", smooth_ap), ("roadmap", "roadmap", roadmap), ("rambo", "rambo", rambo)]
    for name, key, fn in checks:
        if key + "_loss" not in ref:
            continue
        emb = torch.tensor(ref["embeddings"], dtype=torch.float64).view(b, d).requires_grad_()
        loss = fn(emb, fine)
        loss.backward()
        ours = ref[key + "_loss"]
        g_ref = torch.tensor(ref[key + "_grad"], dtype=torch.float64).view(b, d)
        value = float(loss.detach())
        diff = abs(value - ours)
        gdiff = float((emb.grad - g_ref).abs().max())
        print(json.dumps({
            "check": name, "B": b, "dtype": "float64",
            "torch_loss": value, "rankwise_loss": ours, "abs_diff": diff,
            "grad_max_abs_diff": gdiff, "grad_max_abs": float(g_ref.abs().max()),
            "pass_1e-10": diff <= 1e-10,
        }))
        failed += diff > 1e-10
    return 1 if failed else 0


def table(rust_path, torch_path):
    def load(p):
        rows = {}
        with open(p) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    r = json.loads(line)
                    rows[(r["loss"], r["B"])] = r
        return rows

    rust, tch = load(rust_path), load(torch_path)
    print("| loss | B | rankwise s | torch s | torch / rankwise | rankwise peak RSS (MiB) | torch peak RSS (MiB) |")
    print("|---|---|---|---|---|---|---|")
    order = LOSSES
    for name in order:
        for b in BATCHES:
            r, t = rust.get((name, b)), tch.get((name, b))
            if r is None and t is None:
                continue
            rs = f"{r['seconds']:.4g}" if r else "—"
            rm = f"{r['peak_rss_mib']:.0f}" if r else "—"
            if t is None:
                ts, tm, ratio = "—", "—", "—"
            elif "skipped" in t:
                ts, tm, ratio = t["skipped"], "—", "—"
            else:
                ts, tm = f"{t['seconds']:.4g}", f"{t['peak_rss_mib']:.0f}"
                ratio = f"{t['seconds'] / r['seconds']:.1f}×" if r else "—"
            print(f"| {name} | {b} | {rs} | {ts} | {ratio} | {rm} | {tm} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--one", nargs=2, metavar=("LOSS", "B"))
    ap.add_argument("--loss", action="append")
    ap.add_argument("--batch", action="append", type=int)
    ap.add_argument("--reps", type=int)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--check")
    ap.add_argument("--table", nargs=2, metavar=("RUST_JSONL", "TORCH_JSONL"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.check:
        return check(args.check)
    if args.table:
        return table(*args.table)
    if args.one:
        name, b = args.one[0], int(args.one[1])
        print(json.dumps(run_one(name, b, args.reps)), flush=True)
        return 0
    out = open(args.out, "a") if args.out else None
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
