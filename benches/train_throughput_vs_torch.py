#!/usr/bin/env python3
"""Training throughput of PyTorch on the CPU or a CUDA GPU, for comparison with
`cargo run --release --example train_throughput` (benches/train_throughput_vs_torch.md).

The same step as the Rust example: images/s of forward + backward + Adam step of an embedding
network (backbone -> global average pooling -> LayerNorm without affine -> Linear(512) -> L2
normalisation) with the same batch-coupled loss (minus the mean of s_ij * (+1 same class, -1
otherwise) over the B x B similarity matrix), BatchNorm in training mode, random images,
classes of 4 consecutive images. Each step ends with `loss.item()` (as a training loop that
logs its loss does), which also waits for the GPU.

CPU (as before; one configuration per run):

    /work/venv-torch/bin/python benches/train_throughput_vs_torch.py --model small --size 32 --steps 20
    /work/venv-torch/bin/python benches/train_throughput_vs_torch.py --model resnet18 --size 224 --steps 3

GPU (issue 20; all configurations in one process, about 30-40 s on an H100 including start-up):

    python3 benches/train_throughput_vs_torch.py --device cuda \\
        --config resnet50:224:256 --config resnet18:224:256 --config small:32:64 \\
        --out target/torch_train_cuda.jsonl

`--config MODEL:SIZE:BATCH` (repeatable) replaces --model/--size/--batch. Steps: `--warmup`
untimed steps (default 1 on the CPU, 3 on CUDA, where the first steps load kernels and pick
cuDNN algorithms), then either exactly `--steps N` timed steps (the CPU default: 10), or, with
`--steps auto` (the CUDA default), at least `--min-steps` (5) and more until they add up to
`--time-s` (3 s, at most `--max-steps` 500) —
the small CNN at batch 64 takes milliseconds per step on a GPU, a ResNet-50 at batch 256 a
few hundred. On CUDA the timing starts after `torch.cuda.synchronize()`; the peak memory is
`torch.cuda.max_memory_allocated` after `reset_peak_memory_stats` (taken once the model, its
Adam state and the images are on the GPU, so it counts them all).

The anchor is plain float32 eager PyTorch with PyTorch's default settings: no AMP, no
channels-last, no torch.compile, and `torch.backends.cudnn.benchmark` left False. Those
defaults include TF32 for cuDNN convolutions (`torch.backends.cudnn.allow_tf32` = True) but not
for matmuls (`torch.backends.cuda.matmul.allow_tf32` = False), which matters when comparing
with a pure-f32 implementation: every row records these settings.

Output: one JSON line per configuration, printed to stdout, or appended to `--out` when given;
a human-readable summary line goes to stderr. Fields: impl ("torch"), model, size, batch,
device, status ("ok" | "oom" | "error", with `error`), images_per_s (batch x timed steps / their
total time), s_per_step (mean), s_per_step_median, steps, warmup_steps, params (trainable),
loss_last, peak_mib (CUDA: max_memory_allocated; CPU: the process's peak RSS, VmHWM), threads,
torch, and on CUDA gpu, cuda, cudnn (version), settings {cudnn_enabled, cudnn_benchmark,
cudnn_deterministic, cudnn_allow_tf32, matmul_allow_tf32, float32_matmul_precision and, where
this PyTorch has them, the fp32_precision settings}.

Models: `small` = rankwise's SmallCnn (stages of conv3x3-BN-ReLU, widths 32,64,128,256, 2x2 max
pooling between stages), `resnet18` / `resnet34` / `resnet50` = torchvision's, without the
classifier.
"""
import argparse
import gc
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = ["small", "resnet18", "resnet34", "resnet50"]


class SmallCnn(nn.Module):
    def __init__(self, widths=(32, 64, 128, 256), convs_per_stage=1):
        super().__init__()
        layers, c = [], 3
        for s, w in enumerate(widths):
            for _ in range(convs_per_stage):
                layers += [nn.Conv2d(c, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU()]
                c = w
            if s + 1 < len(widths):
                layers.append(nn.MaxPool2d(2))
        self.body = nn.Sequential(*layers)
        self.out_channels = c

    def forward(self, x):
        return self.body(x)


class Backbone(nn.Module):
    """A torchvision ResNet up to its last feature map."""

    def __init__(self, resnet):
        super().__init__()
        self.body = nn.Sequential(*list(resnet.children())[:-2])
        self.out_channels = resnet.fc.in_features

    def forward(self, x):
        return self.body(x)


class EmbeddingNet(nn.Module):
    def __init__(self, backbone, dim=512):
        super().__init__()
        self.backbone = backbone
        self.fc = nn.Linear(backbone.out_channels, dim)

    def forward(self, x):
        h = self.backbone(x).mean(dim=(2, 3))
        h = F.layer_norm(h, h.shape[1:])
        return F.normalize(self.fc(h), dim=1)


def build(name):
    if name == "small":
        return SmallCnn()
    import torchvision

    return Backbone(getattr(torchvision.models, name)(weights=None))


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


def settings():
    """PyTorch's float32/cuDNN settings in force (left at their defaults by this script)."""
    s = {
        "cudnn_enabled": torch.backends.cudnn.enabled,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    # The finer-grained API of newer PyTorch releases (absent from older ones).
    for key, obj in [("fp32_precision", torch.backends),
                     ("matmul_fp32_precision", torch.backends.cuda.matmul),
                     ("cudnn_conv_fp32_precision", getattr(torch.backends.cudnn, "conv", None))]:
        value = getattr(obj, "fp32_precision", None) if obj is not None else None
        if value is not None:
            s[key] = value
    return s


def is_oom(exc):
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    msg = str(exc)
    return any(t in msg for t in ("out of memory", "ALLOC_FAILED", "can't allocate memory"))


def run_config(model_name, size, batch, dev, args):
    """Times one (model, input size, batch) configuration; returns the JSON-ready row."""
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    torch.manual_seed(0)
    model = EmbeddingNet(build(model_name)).train().to(dev)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    # Drawn on the CPU (the same images whatever the device), then moved once: the step reads
    # resident images, no data loading.
    x = torch.randn(batch, 3, size, size).to(dev)
    labels = torch.arange(batch, device=dev) // 4
    sign = (labels[:, None] == labels[None, :]).float() * 2 - 1

    def step():
        opt.zero_grad(set_to_none=True)
        e = model(x)
        loss = -(e @ e.t() * sign).mean()
        loss.backward()
        opt.step()
        return loss.item()

    # Adam's state is created by the first step: reset the peak before it, so peak_mib counts the
    # weights, gradients, Adam moments, images and activations.
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    else:
        reset_peak_rss()
    warmup = args.warmup if args.warmup is not None else (3 if cuda else 1)
    for _ in range(warmup):
        step()
    sync()
    times, loss = [], float("nan")
    # --steps: a number, or "auto" (time-based); default auto on CUDA, 10 on the CPU (as before).
    steps = args.steps or ("auto" if cuda else "10")
    fixed = steps != "auto"
    n_fixed = int(steps) if fixed else 0
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        loss = step()  # .item() waits for the GPU
        times.append(time.perf_counter() - t0)
        if fixed:
            if len(times) >= n_fixed:
                break
        elif len(times) >= args.max_steps or (len(times) >= args.min_steps and sum(times) >= args.time_s):
            break
    sync()
    secs = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(dev) / 2**20 if cuda else peak_rss_mib()
    # Where the step's time goes, as `examples/gpu_check.rs` reports ours: the forward pass
    # alone (training mode, its graph built) and the optimizer's step alone (on the last step's
    # gradients, which the next step's zero_grad would clear).
    reps = max(3, min(len(times), 20))
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        model(x).sum().item()
    forward_s = (time.perf_counter() - t0) / reps
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        opt.step()
    sync()
    optimizer_s = (time.perf_counter() - t0) / reps
    row = {
        "impl": "torch", "model": model_name, "size": size, "batch": batch, "device": dev.type,
        "status": "ok",
        "images_per_s": len(times) * batch / secs,
        "s_per_step": secs / len(times),
        "s_per_step_median": sorted(times)[len(times) // 2],
        "steps": len(times), "warmup_steps": warmup, "params": params, "loss_last": loss,
        "peak_mib": peak,
        "forward_s_per_step": forward_s, "optimizer_s_per_step": optimizer_s,
        "optimizer_foreach": opt.defaults.get("foreach"),
    }
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="small", choices=MODELS)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--config", action="append", metavar="MODEL:SIZE:BATCH",
                   help="repeatable; replaces --model/--size/--batch, e.g. resnet50:224:256")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--steps", help="N: exactly N timed steps; auto: time-based (see --time-s). "
                   "Default: 10 on the CPU, auto on CUDA")
    p.add_argument("--warmup", type=int, help="untimed steps first (default: 1 on the CPU, 3 on CUDA)")
    p.add_argument("--min-steps", type=int, default=5, help="--steps auto: at least this many (5)")
    p.add_argument("--max-steps", type=int, default=500, help="--steps auto: at most this many (500)")
    p.add_argument("--time-s", type=float, default=3.0,
                   help="--steps auto: timed steps until they add up to this (3 s)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", help="append the JSON lines to this file instead of printing them")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("train_throughput_vs_torch.py: --device cuda but no CUDA device", file=sys.stderr)
        return 2

    configs = []
    for c in args.config or [f"{args.model}:{args.size}:{args.batch}"]:
        model, size, batch = c.split(":")
        if model not in MODELS:
            p.error(f"--config {c}: unknown model {model!r} (choose from {', '.join(MODELS)})")
        configs.append((model, int(size), int(batch)))

    common = {"threads": torch.get_num_threads(), "torch": torch.__version__}
    if dev.type == "cuda":
        common.update({"gpu": torch.cuda.get_device_name(dev), "cuda": torch.version.cuda,
                       "cudnn": torch.backends.cudnn.version(), "settings": settings()})
    out = open(args.out, "a") if args.out else sys.stdout
    for model, size, batch in configs:
        failure = None
        try:
            row = run_config(model, size, batch, dev, args)
        except Exception as exc:  # noqa: BLE001 -- an out-of-memory error becomes a row
            failure = ("oom" if is_oom(exc) else "error", f"{type(exc).__name__}: {str(exc).strip()[:300]}")
        # Free this configuration's model, optimiser state and activations before the next one
        # (outside the `except` block, once the traceback and its tensors are gone).
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        if failure:
            row = {"impl": "torch", "model": model, "size": size, "batch": batch, "device": dev.type,
                   "status": failure[0], "error": failure[1]}
            print(f"torch {model} {size}x{size} batch {batch} on {dev}: {failure[0]}: {failure[1]}",
                  file=sys.stderr, flush=True)
        else:
            print(f"torch {model} {size}x{size} batch {batch} on {dev}: "
                  f"{row['images_per_s']:.1f} images/s ({row['s_per_step']:.4f} s/step over "
                  f"{row['steps']} steps, peak {row['peak_mib']:.0f} MiB, {row['params']} trainable "
                  f"parameters, {torch.get_num_threads()} threads, torch {torch.__version__})",
                  file=sys.stderr, flush=True)
        row.update(common)
        row["unix_end_ms"] = int(time.time() * 1000)  # for scripts/gpu_check.sh's memory windows
        out.write(json.dumps(row) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
