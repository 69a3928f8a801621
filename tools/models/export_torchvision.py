#!/usr/bin/python3
"""Export real models (torchvision architectures with random weights, and a small
Transformer encoder) to ONNX, together with a fixed random input and PyTorch's output
for it, so the Teq runtime and ONNX Runtime can be checked against PyTorch.

Needs Debian's /usr/bin/python3 (python3-torch, python3-torchvision, python3-onnx,
numpy). Every export is deterministic: the weights come from torch.manual_seed(SEED),
the input from numpy's PCG64 generator with a fixed per-model seed.

For each model NAME it writes, into CACHE/NAME/:
    model.onnx      opset 13, eval mode, one input "input" and one output "output"
    input_0.pb      the input as an ONNX TensorProto (name "input")
    input_0.bin     the same input as raw little-endian float32
    output_0.pb     PyTorch's output as an ONNX TensorProto (name "output")
    output_0.bin    the same output as raw little-endian float32
    meta.json       input/output names and shapes, seeds, op counts, torch version
A model whose files all exist, exported with its parameters drawn as now (meta.json's
constants_drawn), is skipped (the cache); --cached only says whether all are. Files are written under a
temporary name and renamed, so an interrupted export never leaves a half cache.

Usage:
    /usr/bin/python3 tools/models/export_torchvision.py [CACHE] [--models a,b] [--list] [--force]
                                                        [--reserve MB] [--cached]
CACHE defaults to $TEQ_CACHE, else .cache/models under the repository root.

Disk: VGG-19 alone is 575 MB. With --reserve MB a model is exported only where
the disk holds its weights twice (the export, and the round trip or optimized
copy every caller writes next) and MB more besides; one that does not fit is
named and left out. A disk that fills anyway stops the export with the
partial file removed. Either way the exit status is 4.
"""

import argparse
import collections
import errno
import json
import os
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OPSET = 13
WEIGHT_SEED = 0
CALIBRATION_BATCHES = 2  # random batches that set BatchNorm running statistics
CALIBRATION_BATCH = 4
FILES = ("model.onnx", "input_0.pb", "input_0.bin", "output_0.pb", "output_0.bin", "meta.json")


def calibrate_batchnorm(model, torch, shape):
    """Give every BatchNorm realistic statistics and non-trivial affine parameters.

    Freshly built torchvision models have mean 0, var 1, weight 1, bias 0 in every BN. Then
    folding BN into the preceding conv is an identity (a folding bug would go unnoticed), and
    activations drift by orders of magnitude through deep stacks (inception_v3 reaches 1e12),
    which makes tolerances meaningless. A trained network's BN statistics match its
    activations, so estimate them as training would: run a few random batches in training
    mode with a cumulative average (momentum None). Weight and bias are drawn from the
    (already seeded) torch generator. Returns the number of BN layers."""
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return 0
    with torch.no_grad():
        for bn in bns:
            bn.weight.copy_(torch.rand(bn.num_features) * 0.5 + 0.75)
            bn.bias.copy_(torch.randn(bn.num_features) * 0.1)
            bn.reset_running_stats()
            bn.momentum = None
        model.train()
        for _ in range(CALIBRATION_BATCHES):
            model(torch.randn((CALIBRATION_BATCH,) + tuple(shape[1:])))
        model.eval()
        for bn in bns:
            bn.momentum = 0.1
    return len(bns)


def draw_constant_parameters(model, torch):
    """Draws every parameter that holds one value everywhere, as training would have moved it;
    returns how many.

    A freshly built network starts its biases at 0 and its LayerNorm and GroupNorm scales at
    1 (ConvNeXt's layer scales at 1e-6 each, a ViT's head and class token at 0). Exported
    so, its graph is not a trained model's: Teq's import rightly drops x + 0 and x * 1, so
    Swin-T came out without the bias adds of its 48 linear layers and the scales of its
    layer norms, and a head of zeros would make every output 0 and every comparison
    vacuous. A matrix or kernel of zeros is drawn from N(0, 1/fan_in); any other constant
    parameter c from c + N(0, 0.05) where c is 0, else c (1 + N(0, 0.1)): a bias, a norm's
    scale or a layer scale that differs per channel. BatchNorm's are drawn by
    calibrate_batchnorm, with its statistics, after these (which they depend on)."""
    bn = torch.nn.modules.batchnorm._BatchNorm
    skip = {id(p) for m in model.modules() if isinstance(m, bn) for p in m.parameters()}
    n = 0
    with torch.no_grad():
        for p in model.parameters():
            if id(p) in skip or p.numel() < 2 or not (p == p.reshape(-1)[0]).all():
                continue
            c = float(p.reshape(-1)[0])
            if p.dim() >= 2 and c == 0:
                p.normal_(0.0, (p[0].numel()) ** -0.5)
            elif c == 0:
                p.normal_(0.0, 0.05)
            else:
                p.mul_(1 + 0.1 * torch.randn_like(p))
            n += 1
    return n


def build_torchvision(name, family=None, **kwargs):
    """family: the torchvision.models submodule that holds it ("video"), if any."""
    def build(torch, torchvision):
        models = getattr(torchvision.models, family) if family else torchvision.models
        return getattr(models, name)(weights=None, **kwargs)
    return build


def build_segmentation(name):
    """A torchvision segmentation network, its dictionary of outputs cut to the one
    prediction ("out": a score per class and pixel, upsampled to the input's size);
    weights_backbone=None: the backbone's ImageNet weights would be downloaded."""
    def build(torch, torchvision):
        net = getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None)

        class Out(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = net

            def forward(self, x):
                return self.net(x)["out"]
        return Out()
    return build


def build_transformer(torch, torchvision):
    # BERT-like encoder: d_model 256, 4 heads, 2 layers, feed-forward 4 x d_model.
    # enable_nested_tensor=False: no nested tensors (they need a padding mask anyway).
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024,
                                             dropout=0.1, batch_first=True)
    return torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)


def build_iresnet50(torch, torchvision):
    """InsightFace's ArcFace backbone, IResNet-50, on 112x112 faces: each block is
    BN, 3x3 conv, BN, PReLU, 3x3 conv (the stride), BN, plus the shortcut; the embedding
    is a BN, a flatten, a linear layer of 512 and a BatchNorm1d. Trained PReLU slopes
    differ per channel, so they are drawn, not left at their shared initial 0.25."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(
                nn.BatchNorm2d(cin), nn.Conv2d(cin, cout, 3, 1, 1, bias=False),
                nn.BatchNorm2d(cout), nn.PReLU(cout),
                nn.Conv2d(cout, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout))
            self.short = None
            if stride != 1 or cin != cout:
                self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                           nn.BatchNorm2d(cout))

        def forward(self, x):
            return self.body(x) + (self.short(x) if self.short is not None else x)

    layers = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.PReLU(64)]
    cin = 64
    for cout, blocks in ((64, 3), (128, 4), (256, 14), (512, 3)):
        for b in range(blocks):
            layers.append(Block(cin, cout, 2 if b == 0 else 1))
            cin = cout
    layers += [nn.BatchNorm2d(512), nn.Flatten(), nn.Linear(512 * 7 * 7, 512),
               nn.BatchNorm1d(512)]
    model = nn.Sequential(*layers)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.PReLU):
                m.weight.uniform_(0.05, 0.45)
    return model


# name -> (builder, input shape, input seed, export options)
#   keep_bn: export BatchNormalization nodes instead of letting torch fold them into Conv
#   grad_path: trace with autograd enabled so torch 1.13 takes the composite (standard-ops)
#     path of TransformerEncoderLayer / MultiheadAttention instead of the fused
#     aten::_transformer_encoder_layer_fwd fast path, which has no ONNX export. The fast
#     path is only taken when grad is disabled or no parameter requires grad.
MODELS = collections.OrderedDict([
    ("resnet18", (build_torchvision("resnet18"), (1, 3, 224, 224), 1, {})),
    ("resnet50", (build_torchvision("resnet50"), (1, 3, 224, 224), 2, {})),
    ("squeezenet1_1", (build_torchvision("squeezenet1_1"), (1, 3, 224, 224), 3, {})),
    ("mobilenet_v2", (build_torchvision("mobilenet_v2"), (1, 3, 224, 224), 4, {})),
    ("resnext50_32x4d", (build_torchvision("resnext50_32x4d"), (1, 3, 224, 224), 5, {})),
    # aux_logits=False: no auxiliary head at all; init_weights=True: torchvision 0.14
    # initialises with torch.nn.init.trunc_normal_ (no scipy) and stops warning.
    ("inception_v3", (build_torchvision("inception_v3", aux_logits=False, init_weights=True),
                      (1, 3, 299, 299), 6, {})),
    ("transformer", (build_transformer, (1, 32, 256), 7, {"grad_path": True})),
    ("vgg19", (build_torchvision("vgg19"), (1, 3, 224, 224), 8, {})),
    ("resnet18_bn", (build_torchvision("resnet18"), (1, 3, 224, 224), 1, {"keep_bn": True})),
])

# The zoo: further torchvision architectures no paper of ours measures, exported only
# when named (--models, or --models zoo for all of them). They test that Teq takes real
# models it was not tuned on: depthwise and grouped convolutions with squeeze-excitation
# (EfficientNet, MnasNet, RegNet, MobileNetV3), channel shuffles (ShuffleNet), dense
# concatenation (DenseNet), LayerNorm and GELU (ConvNeXt, ViT), Swin's shifted
# windows, whose attention masks the exporter builds from shapes with ScatterND, and
# MaxViT's block and grid attention, written with Einsum, and the video networks'
# convolutions and pools over three axes (R3D-18: 8 frames of 112x112; S3D: 16 of
# 224x224), the PReLUs and pre-activation BatchNorms of face recognition's IResNet, and
# semantic segmentation's dilated backbones, atrous pyramids and bilinear upsampling
# (DeepLabV3 and LR-ASPP on MobileNetV3; FCN on ResNet-50 is left out: with random
# weights its output differs from PyTorch's by 1.4e-4 in Teq and 1.2e-4 in ONNX
# Runtime, and Teq's from ONNX Runtime's by 1.0e-4: the conditioning of 50 layers,
# not any one's error). Their parameters that hold
# one value everywhere are drawn as trained ones (draw_constant_parameters); the papers'
# suite above keeps torchvision's initial values, as the papers' graphs carry no biases.
ZOO = collections.OrderedDict([
    ("alexnet", (build_torchvision("alexnet"), (1, 3, 224, 224), 20, {})),
    ("googlenet", (build_torchvision("googlenet", aux_logits=False, init_weights=True),
                   (1, 3, 224, 224), 21, {})),
    ("densenet121", (build_torchvision("densenet121"), (1, 3, 224, 224), 22, {})),
    ("shufflenet_v2_x1_0", (build_torchvision("shufflenet_v2_x1_0"), (1, 3, 224, 224), 23, {})),
    ("mnasnet1_0", (build_torchvision("mnasnet1_0"), (1, 3, 224, 224), 24, {})),
    ("mobilenet_v3_small", (build_torchvision("mobilenet_v3_small"), (1, 3, 224, 224), 25, {})),
    ("efficientnet_b0", (build_torchvision("efficientnet_b0"), (1, 3, 224, 224), 26, {})),
    ("regnet_y_400mf", (build_torchvision("regnet_y_400mf"), (1, 3, 224, 224), 27, {})),
    ("convnext_tiny", (build_torchvision("convnext_tiny"), (1, 3, 224, 224), 28, {})),
    ("vit_b_16", (build_torchvision("vit_b_16"), (1, 3, 224, 224), 29, {"grad_path": True})),
    ("swin_t", (build_torchvision("swin_t"), (1, 3, 224, 224), 30, {})),
    ("maxvit_t", (build_torchvision("maxvit_t"), (1, 3, 224, 224), 31, {})),
    ("r3d_18", (build_torchvision("r3d_18", "video"), (1, 3, 8, 112, 112), 32, {})),
    ("s3d", (build_torchvision("s3d", "video"), (1, 3, 16, 224, 224), 33, {})),
    ("iresnet50", (build_iresnet50, (1, 3, 112, 112), 34, {})),
    ("lraspp_mobilenet_v3_large", (build_segmentation("lraspp_mobilenet_v3_large"),
                                   (1, 3, 224, 224), 35, {})),
    ("deeplabv3_mobilenet_v3_large", (build_segmentation("deeplabv3_mobilenet_v3_large"),
                                      (1, 3, 224, 224), 36, {})),
])
ALL = collections.OrderedDict(list(MODELS.items()) + list(ZOO.items()))


def cache_complete(outdir, name):
    """All of name's files are there, exported with its parameters drawn as now."""
    if not all(os.path.isfile(os.path.join(outdir, f)) for f in FILES):
        return False
    try:
        with open(os.path.join(outdir, "meta.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return False
    return meta.get("constants_drawn", False) == (name in ZOO)


def tmp_name(path):
    """path's name while it is written: one per process, as two tests may export the
    same model into one cache at once."""
    return f"{path}.{os.getpid()}.tmp"


def write_atomic(path, data):
    tmp = tmp_name(path)
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def build_model(name, torch, torchvision):
    """Model name in eval mode, with the weights every export and benchmark of it uses."""
    builder, shape, _, opts = ALL[name]
    torch.manual_seed(WEIGHT_SEED)
    model = builder(torch, torchvision)
    if name in ZOO:
        draw_constant_parameters(model, torch)
    calibrate_batchnorm(model, torch, shape)
    return model.eval()


class NoRoom(Exception):
    """A model the disk has no room for (exit status 4)."""


def free_mb(path):
    """Megabytes free to an unprivileged writer on path's file system."""
    while not os.path.exists(path):
        path = os.path.dirname(path) or "."
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize / 1e6


def export_one(name, outdir, torch, torchvision, onnx, np, reserve_mb=None):
    from onnx import numpy_helper

    _, shape, input_seed, opts = ALL[name]
    model = build_model(name, torch, torchvision)
    if reserve_mb is not None:
        weights_mb = sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 1e6
        need, have = 2 * weights_mb + reserve_mb, free_mb(outdir)
        if have < need:
            raise NoRoom(f"{name}: not exported: needs about {need:.0f} MB free "
                         f"({weights_mb:.0f} MB of weights twice, {reserve_mb:.0f} MB reserved), "
                         f"{have:.0f} MB free under {outdir}")

    x_np = np.random.default_rng(input_seed).standard_normal(shape, dtype=np.float32)
    x = torch.from_numpy(x_np.copy())

    grad_ctx = torch.enable_grad() if opts.get("grad_path") else torch.no_grad()
    with grad_ctx:
        y = model(x)
    y_np = y.detach().numpy().astype(np.float32)

    export_kwargs = dict(opset_version=OPSET, input_names=["input"], output_names=["output"],
                         do_constant_folding=True)
    if opts.get("keep_bn"):
        export_kwargs.update(training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False)

    os.makedirs(outdir, exist_ok=True)
    onnx_path = os.path.join(outdir, "model.onnx")
    tmp_onnx = tmp_name(onnx_path)
    with grad_ctx:
        try:  # torch >= 2.9 exports through dynamo unless told otherwise
            torch.onnx.export(model, x, tmp_onnx, dynamo=False, **export_kwargs)
        except TypeError:
            torch.onnx.export(model, x, tmp_onnx, **export_kwargs)
        except torch.onnx.errors.UnsupportedOperatorError:
            # Newer torch traces attention as scaled_dot_product_attention,
            # which ONNX expresses from opset 14 on.
            export_kwargs["opset_version"] = 14
            torch.onnx.export(model, x, tmp_onnx, dynamo=False, **export_kwargs)

    proto = onnx.load(tmp_onnx)
    onnx.checker.check_model(proto)
    ops = collections.Counter(n.op_type for n in proto.graph.node)
    foreign = sorted({f"{n.domain}::{n.op_type}" for n in proto.graph.node
                      if n.domain not in ("", "ai.onnx")})
    if foreign:
        os.remove(tmp_onnx)
        raise RuntimeError(f"{name}: exported non-standard ops {foreign}")
    if opts.get("keep_bn") and ops.get("BatchNormalization", 0) == 0:
        os.remove(tmp_onnx)
        raise RuntimeError(f"{name}: expected BatchNormalization nodes, found none")

    write_atomic(os.path.join(outdir, "input_0.pb"),
                 numpy_helper.from_array(x_np, name="input").SerializeToString())
    write_atomic(os.path.join(outdir, "input_0.bin"), x_np.astype("<f4").tobytes())
    write_atomic(os.path.join(outdir, "output_0.pb"),
                 numpy_helper.from_array(y_np, name="output").SerializeToString())
    write_atomic(os.path.join(outdir, "output_0.bin"), y_np.astype("<f4").tobytes())
    os.replace(tmp_onnx, onnx_path)
    meta = {
        "model": name,
        "opset": OPSET,
        "weight_seed": WEIGHT_SEED,
        "input_seed": input_seed,
        "inputs": [{"name": "input", "shape": list(shape)}],
        "outputs": [{"name": "output", "shape": list(y_np.shape)}],
        "output_max_abs": float(np.abs(y_np).max()),
        "keep_bn": bool(opts.get("keep_bn")),
        "constants_drawn": name in ZOO,
        "ops": dict(sorted(ops.items())),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "onnx": onnx.__version__,
    }
    # meta.json last: its presence marks a complete cache entry.
    write_atomic(os.path.join(outdir, "meta.json"),
                 (json.dumps(meta, indent=1) + "\n").encode())
    return ops, y_np.shape, os.path.getsize(onnx_path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cache", nargs="?", default=None,
                    help="cache directory (default $TEQ_CACHE or REPO/.cache/models)")
    ap.add_argument("--models", default=None,
                    help="comma-separated subset, zoo for the zoo (default: all but the zoo; "
                         "see --list)")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    ap.add_argument("--force", action="store_true", help="re-export even if cached")
    ap.add_argument("--cached", action="store_true",
                    help="export nothing; exit 0 if every model named is cached as it would be "
                         "exported now, else 1")
    ap.add_argument("--reserve", type=float, default=None, metavar="MB",
                    help="leave out a model unless the disk holds its weights twice and MB "
                         "more (exit status 4 when any was left out)")
    args = ap.parse_args()

    if args.list:
        for name, (_, shape, _, opts) in ALL.items():
            extra = " (BatchNormalization kept)" if opts.get("keep_bn") else ""
            extra += " (zoo: only when named)" if name in ZOO else ""
            print(f"{name}\tinput {'x'.join(map(str, shape))}{extra}")
        return 0

    cache = args.cache or os.environ.get("TEQ_CACHE") or os.path.join(REPO_ROOT, ".cache", "models")
    names = list(MODELS) if not args.models else [m.strip() for m in args.models.split(",") if m.strip()]
    names = [z for n in names for z in (ZOO if n == "zoo" else [n])]
    unknown = [n for n in names if n not in ALL]
    if unknown:
        print(f"export_torchvision: unknown model(s) {', '.join(unknown)}; "
              f"known: {', '.join(ALL)}, zoo", file=sys.stderr)
        return 2

    todo = [n for n in names if args.force or not cache_complete(os.path.join(cache, n), n)]
    if args.cached:
        return 1 if todo else 0
    for n in names:
        if n not in todo:
            print(f"{n}: cached in {os.path.join(cache, n)}")
    if not todo:
        return 0

    try:
        import numpy as np
        import onnx
        import torch
        import torchvision
    except ImportError as e:
        print(f"export_torchvision: {e}; run with Debian's /usr/bin/python3 "
              f"(python3-torch, python3-torchvision, python3-onnx)", file=sys.stderr)
        return 3
    import warnings
    warnings.filterwarnings("ignore")
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    left_out = []
    for n in todo:
        outdir = os.path.join(cache, n)
        if os.path.exists(os.path.join(outdir, "meta.json")):
            os.remove(os.path.join(outdir, "meta.json"))
        t0 = time.monotonic()
        try:
            ops, out_shape, size = export_one(n, outdir, torch, torchvision, onnx, np,
                                              args.reserve)
        except NoRoom as e:
            print(e, file=sys.stderr, flush=True)
            left_out.append(n)
            continue
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            # Partial files would hold the space other work needs.
            for f in os.listdir(outdir) if os.path.isdir(outdir) else []:
                if f.endswith(f".{os.getpid()}.tmp"):
                    os.remove(os.path.join(outdir, f))
            print(f"{n}: no space left on the device under {outdir} "
                  f"({free_mb(outdir):.0f} MB free after removing the partial files)",
                  file=sys.stderr, flush=True)
            return 4
        dt = time.monotonic() - t0
        print(f"{n}: exported to {outdir} in {dt:.1f} s; {sum(ops.values())} nodes, "
              f"{size / 1e6:.1f} MB, output {'x'.join(map(str, out_shape))}", flush=True)
    return 4 if left_out else 0


if __name__ == "__main__":
    sys.exit(main())
