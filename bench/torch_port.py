"""A Darknet detector cfg ported layer for layer to PyTorch, for reference timings only.

The bench compares darknet-py with what a user would pick instead: PyTorch with cuDNN, in
fp32 and in automatic mixed precision (autocast + channels_last). This module is imported by
the bench scripts alone; darknet-py itself never imports torch.

Covered: [convolutional] (groups, batch norm, the usual activations), [maxpool] (stride 1
SPP blocks and 2x2/2), [route] (several layers, groups/group_id), [shortcut], [upsample]
and [yolo] (its input passes through: the heads' loss is a small share of a step in both
programs, so the port's loss is a sum of squares over the heads' outputs).
"""

import re

import torch
import torch.nn as nn
import torch.nn.functional as F


def read_sections(path):
    """[(type, {key: value})] of a cfg, [net] first."""
    sections = []
    for raw in open(path, encoding="utf-8"):
        line = re.sub(r"[#;].*", "", raw).strip().replace(" ", "")
        if not line:
            continue
        if line.startswith("["):
            sections.append((line.strip("[]"), {}))
        elif "=" in line and sections:
            key, value = line.split("=", 1)
            sections[-1][1][key] = value
    return sections


def activation(name):
    return {
        "leaky": nn.LeakyReLU(0.1),
        "relu": nn.ReLU(),
        "mish": nn.Mish(),
        "logistic": nn.Sigmoid(),
        "swish": nn.SiLU(),
        "linear": nn.Identity(),
    }[name]


class Conv(nn.Module):
    def __init__(self, c_in, opts):
        super().__init__()
        size, stride = int(opts.get("size", 1)), int(opts.get("stride", 1))
        pad = size // 2 if int(opts.get("pad", 0)) else int(opts.get("padding", 0))
        bn = int(opts.get("batch_normalize", 0))
        self.out_c = int(opts["filters"])
        self.conv = nn.Conv2d(
            c_in, self.out_c, size, stride, pad, groups=int(opts.get("groups", 1)), bias=not bn
        )
        self.bn = nn.BatchNorm2d(self.out_c) if bn else nn.Identity()
        self.act = activation(opts.get("activation", "logistic"))

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class DarknetMaxPool(nn.Module):
    """Darknet's maxpool: `padding` (default size - 1) split with the smaller half on the
    top/left, so 2x2 stride-1 pools keep the size (yolov3-tiny's 13x13 pool)."""

    def __init__(self, size, stride, padding):
        super().__init__()
        self.size, self.stride = size, stride
        self.pad = (padding // 2, padding - padding // 2) * 2

    def forward(self, x):
        x = F.pad(x, self.pad, value=float("-inf"))
        return F.max_pool2d(x, self.size, self.stride)


class DarknetPort(nn.Module):
    def __init__(self, path):
        super().__init__()
        sections = read_sections(path)
        net = sections[0][1]
        self.input_shape = (int(net.get("channels", 3)), int(net["height"]), int(net["width"]))
        self.kinds, self.args = [], []
        mods, channels, c = [], [], self.input_shape[0]
        for kind, opts in sections[1:]:
            index = len(self.kinds)
            mod, arg = nn.Identity(), None
            if kind in ("convolutional", "conv"):
                mod = Conv(c, opts)
                c = mod.out_c
            elif kind in ("maxpool", "max"):
                size = int(opts.get("size", 2))
                stride = int(opts.get("stride", size))
                mod = DarknetMaxPool(size, stride, int(opts.get("padding", size - 1)))
            elif kind == "route":
                layers = [int(v) for v in opts["layers"].split(",")]
                layers = [v + index if v < 0 else v for v in layers]
                groups, group_id = int(opts.get("groups", 1)), int(opts.get("group_id", 0))
                arg = (layers, groups, group_id)
                c = sum(channels[v] for v in layers) // groups
            elif kind == "shortcut":
                source = int(opts["from"])
                arg = source + index if source < 0 else source
            elif kind == "upsample":
                arg = int(opts.get("stride", 2))
            elif kind != "yolo":
                raise ValueError(f"{path}: [{kind}] is not in the PyTorch port")
            self.kinds.append(kind)
            self.args.append(arg)
            mods.append(mod)
            channels.append(c)
        self.layers = nn.ModuleList(mods)

    def forward(self, x):
        outputs, heads = [], []
        for kind, arg, mod in zip(self.kinds, self.args, self.layers):
            if kind == "route":
                layers, groups, group_id = arg
                parts = [outputs[v].chunk(groups, dim=1)[group_id] for v in layers]
                x = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
            elif kind == "shortcut":
                x = x + outputs[arg]
            elif kind == "upsample":
                x = F.interpolate(x, scale_factor=arg, mode="nearest")
            elif kind == "yolo":
                heads.append(x)
            else:
                x = mod(x)
            outputs.append(x)
        return heads


def head_loss(heads):
    return sum((h.float() ** 2).mean() for h in heads)
