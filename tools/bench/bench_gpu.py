#!/usr/bin/env python3
"""Teq's GPU runtime against PyTorch eager and torch.compile, on one GPU, in one run.

For each model and batch size: build the model in PyTorch (the builders and seeded weights
of tools/models/export_torchvision.py), export it to ONNX from that same module, then time

  teq       run-model --gpu: the whole graph as one CUDA graph replay, CUDA events,
            median of --repeats runs after warm-up
  eager     the PyTorch module, one forward per timing, CUDA events, median
  compiled  torch.compile(mode="reduce-overhead") (Inductor with CUDA graphs), likewise

all in strict float32 (TF32 off everywhere). The outputs are compared too: Teq's GPU
output against PyTorch's on the same input (largest |diff| over largest |ref|), and
run-model --check compares Teq's GPU output with its own CPU executor. Only ratios
measured in one run mean anything.

Needs a CUDA machine with torch and torchvision, and a build of run-model with CUDA.
Usage:
    bench_gpu.py [--models a,b] [--batches 1,16] [--repeats 200] [--build DIR] [--out DIR]
Prints a table and writes OUT/results_gpu_bBATCHES.csv and .md.
"""

import argparse
import csv
import datetime
import os
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools", "models"))
import export_torchvision as ex  # noqa: E402  (the model builders and their seeds)

DEFAULT_MODELS = ["resnet18", "resnet50", "resnext50_32x4d", "squeezenet1_1", "mobilenet_v2",
                  "vgg19", "inception_v3", "transformer"]
SHAPES = {name: spec[1] for name, spec in ex.ALL.items()}


def build(name, torch, torchvision):
    return ex.build_model(name, torch, torchvision)


def export(model, x, path, torch, grad_path):
    """ONNX opset 13 through the TorchScript exporter (what the CPU benchmarks use)."""
    kwargs = dict(opset_version=ex.OPSET, input_names=["input"], output_names=["output"],
                  do_constant_folding=True)
    ctx = torch.enable_grad() if grad_path else torch.no_grad()
    with ctx:
        try:
            torch.onnx.export(model, x, path, dynamo=False, **kwargs)
        except TypeError:  # a torch without the dynamo switch
            torch.onnx.export(model, x, path, **kwargs)
        except torch.onnx.errors.UnsupportedOperatorError:
            # Newer torch traces attention as scaled_dot_product_attention,
            # which ONNX can express from opset 14 on.
            kwargs["opset_version"] = 14
            torch.onnx.export(model, x, path, dynamo=False, **kwargs)


def time_torch(fn, x, torch, warmup, repeats):
    with torch.no_grad():
        for _ in range(warmup):
            y = fn(x)
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(repeats):
            start.record()
            y = fn(x)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2], y.detach().float().cpu().clone()


def rel_err(a, b, np):
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    if a.shape != b.shape or np.isnan(a).any() != np.isnan(b).any():
        return float("inf")
    scale = np.abs(b).max()
    return float(np.abs(a - b).max() / scale) if scale > 0 else float(np.abs(a - b).max())


def run_teq(build_dir, onnx_path, x_bin, out_dir, batch, warmup, repeats, check):
    cmd = [os.path.join(build_dir, "tools", "run-model"), "--gpu", "--quiet",
           "--warmup", str(warmup), "--repeat", str(repeats), "--batch", str(batch),
           "--input", f"input={x_bin}", "--output-dir", out_dir]
    if check:
        cmd.append("--check")
    p = subprocess.run(cmd + [onnx_path], capture_output=True, text=True)
    out = p.stdout + p.stderr
    ms = re.search(r"^time ([0-9.]+) ms", p.stdout, re.M)
    err = re.search(r"largest relative error ([0-9.e+-]+|inf|nan)", p.stdout)
    return (float(ms.group(1)) if ms else None, float(err.group(1)) if err else None,
            p.returncode, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--build", default=os.path.join(REPO, "build-gpu"))
    ap.add_argument("--out", default=os.path.join(REPO, "tools", "bench"))
    ap.add_argument("--work", default="/tmp/teq-bench-gpu")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--no-check", action="store_true", help="skip run-model --check (CPU)")
    args = ap.parse_args()

    import numpy as np
    import torch
    import torchvision
    import warnings
    warnings.filterwarnings("ignore")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.benchmark = True
    dev = torch.cuda.get_device_name(0)
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)

    rows = []
    header = ["model", "batch", "teq_ms", "eager_ms", "compiled_ms", "teq/eager",
              "teq/compiled", "err_vs_torch", "err_gpu_vs_cpu"]
    print(f"# {dev}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{datetime.date.today()}, strict float32", flush=True)
    print("{:<16} {:>5} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12} {:>12}".format(*header), flush=True)
    for name in [m for m in args.models.split(",") if m]:
        model = build(name, torch, torchvision)
        grad_path = ex.ALL.get(name, (None, None, None, {}))[3].get("grad_path", False)
        for batch in [int(b) for b in args.batches.split(",")]:
            t0 = time.monotonic()
            shape = (batch,) + tuple(SHAPES[name][1:])
            x_np = np.random.default_rng(100 + batch).standard_normal(shape, dtype=np.float32)
            base = os.path.join(args.work, f"{name}_b{batch}")
            onnx_path, x_bin, out_dir = base + ".onnx", base + ".input.bin", base + ".out"
            try:
                if not os.path.exists(onnx_path):
                    export(model.cpu(), torch.from_numpy(x_np.copy()), onnx_path, torch, grad_path)
            except Exception as e:  # one model's export must not stop the others
                print(f"{name} batch {batch}: export failed: {str(e).splitlines()[-1]}", flush=True)
                continue
            x_np.astype("<f4").tofile(x_bin)
            teq_ms, gpu_cpu, rc, log = run_teq(args.build, onnx_path, x_bin, out_dir, batch,
                                               args.warmup, args.repeats, not args.no_check)
            if rc != 0:
                print(f"{name} batch {batch}: run-model failed (exit {rc}):\n{log}", flush=True)
            cuda_model = model.cuda()
            x = torch.from_numpy(x_np.copy()).cuda()
            eager_ms, y_eager = time_torch(cuda_model, x, torch, args.warmup, args.repeats)
            compiled_ms = None
            if not args.no_compile:
                torch._dynamo.reset()
                compiled = torch.compile(cuda_model, mode="reduce-overhead")
                compiled_ms, _ = time_torch(compiled, x, torch, max(5, args.warmup // 4),
                                            args.repeats)
                del compiled
            err = float("nan")
            out_bin = os.path.join(out_dir, "output_0.bin")
            if rc == 0 and os.path.exists(out_bin):
                err = rel_err(np.fromfile(out_bin, dtype="<f4"), y_eager.numpy(), np)
            row = [name, batch, teq_ms, eager_ms, compiled_ms,
                   teq_ms / eager_ms if teq_ms else None,
                   teq_ms / compiled_ms if teq_ms and compiled_ms else None, err, gpu_cpu]
            rows.append(row)
            fmt = lambda v: "-" if v is None else (f"{v:.3g}" if isinstance(v, float) and (v < 1e-2 or v != v) else (f"{v:.3f}" if isinstance(v, float) else str(v)))
            print("{:<16} {:>5} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12} {:>12}".format(
                *[fmt(v) for v in row]) + f"   ({time.monotonic() - t0:.0f} s)", flush=True)
            model = model.cpu()
            torch.cuda.empty_cache()

    with open(os.path.join(args.out, f"results_gpu_b{args.batches.replace(',', '_')}.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    with open(os.path.join(args.out, f"results_gpu_b{args.batches.replace(',', '_')}.md"), "w") as f:
        f.write(f"{dev}, torch {torch.__version__}, {datetime.date.today()}, strict float32, "
                f"median of {args.repeats} after {args.warmup} warm-up, CUDA events\n\n")
        f.write("| " + " | ".join(header) + " |\n|" + "---|" * len(header) + "\n")
        for r in rows:
            f.write("| " + " | ".join("-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v)) for v in r) + " |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
