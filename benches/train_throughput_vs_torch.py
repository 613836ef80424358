#!/usr/bin/env python3
"""Training throughput of PyTorch on the CPU, for comparison with
`cargo run --release --example train_throughput` (benches/train_throughput_vs_torch.md).

The same step as the Rust example: images/s of forward + backward + Adam step of an embedding
network (backbone -> global average pooling -> LayerNorm without affine -> Linear(512) -> L2
normalisation) with the same batch-coupled loss (minus the mean of s_ij * (+1 same class, -1
otherwise) over the B x B similarity matrix), BatchNorm in training mode, random images,
classes of 4 consecutive images.

    /work/venv-torch/bin/python benches/train_throughput_vs_torch.py --model small --size 32 --steps 20
    /work/venv-torch/bin/python benches/train_throughput_vs_torch.py --model resnet18 --size 224 --steps 3

Models: `small` = rankwise's SmallCnn (stages of conv3x3-BN-ReLU, widths 32,64,128,256, 2x2 max
pooling between stages), `resnet18` / `resnet50` = torchvision's, without the classifier.
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="small", choices=["small", "resnet18", "resnet34", "resnet50"])
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = EmbeddingNet(build(args.model)).train()
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, 3, args.size, args.size)
    labels = torch.arange(args.batch) // 4
    sign = (labels[:, None] == labels[None, :]).float() * 2 - 1

    def step():
        opt.zero_grad(set_to_none=True)
        e = model(x)
        loss = -(e @ e.t() * sign).mean()
        loss.backward()
        opt.step()
        return loss.item()

    step()  # warm-up
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    secs = time.perf_counter() - start
    print(
        f"torch {args.model} {args.size}x{args.size} batch {args.batch}: "
        f"{args.steps * args.batch / secs:.1f} images/s ({secs / args.steps:.3f} s/step, "
        f"{params} trainable parameters, {torch.get_num_threads()} threads, torch {torch.__version__})"
    )


if __name__ == "__main__":
    main()
