#!/usr/bin/env python3
"""bench_scaling.py: how optimize's search time grows with the model.

TASO's search over a whole graph grows faster than the graph; Teq searches
a window of operators at a time, so its time should grow about linearly.
This builds TASO's models with their repeated unit taken 1, 2, 4 ... times
(build-model --scale: NasRNN's steps, NasNet-A's normal cells, BERT's
layers), optimizes each with the same rules and table, and prints per
model and scale the operators, windows, graphs expanded, search seconds
(median of --repeat runs) and seconds per 100 operators, then each model's
growth: the search seconds of its largest scale over its smallest, beside
the ratio of their operators. A ratio of time near the ratio of size is
linear growth; the per-operator column is the same figure row by row.

    tools/bench/bench_scaling.py --build build-release --rules .cache/ruledb.sqlite \\
        [--models nasrnn:1,2,4,8,16 nasneta:1,2,4] [--repeat 3] [--no-pet] [--out DIR]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

DEFAULT_MODELS = ["nasrnn:1,2,4,8,16", "nasneta:1,2,4", "bert:1,2,4"]


def parse_model(text):
    name, _, scales = text.partition(":")
    try:
        values = [int(s) for s in scales.split(",")] if scales else [1, 2, 4]
    except ValueError:
        sys.exit(f"bench_scaling: '{text}': expected NAME:K,K,... with whole numbers")
    if not name or any(v < 1 for v in values):
        sys.exit(f"bench_scaling: '{text}': expected NAME:K,K,... with K >= 1")
    return name, sorted(set(values))


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"bench_scaling: {' '.join(cmd)} failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build-release", help="build directory (default build-release)")
    ap.add_argument("--rules", required=True, help="a rule database made and verified earlier")
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS,
                    help="NAME:K,K,... (default: %s)" % " ".join(DEFAULT_MODELS))
    ap.add_argument("--repeat", type=int, default=3, help="searches per point, median (default 3)")
    ap.add_argument("--no-pet", action="store_true", help="the rules alone (optimize --no-pet)")
    ap.add_argument("--out", help="keep the models and reports here (default: a temporary folder)")
    args = ap.parse_args()
    if args.repeat < 1:
        sys.exit("bench_scaling: --repeat must be at least 1")
    tools = {t: os.path.join(args.build, sub, t)
             for t, sub in (("build-model", "tools"), ("optimize", "optimize"))}
    for t, path in tools.items():
        if not os.access(path, os.X_OK):
            sys.exit(f"bench_scaling: no {t} at {path} (build it first: ninja -C {args.build})")
    if not os.path.isfile(args.rules):
        sys.exit(f"bench_scaling: no rule database at {args.rules}")
    models = [parse_model(m) for m in args.models]
    out = args.out or tempfile.mkdtemp(prefix="teq-scaling-")
    os.makedirs(out, exist_ok=True)
    try:
        report(args, tools, models, out)
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)


def report(args, tools, models, out):
    """Builds, optimizes and prints the table (see the module's docstring)."""

    rows = []
    for name, scales in models:
        for k in scales:
            path = os.path.join(out, f"{name}-x{k}.onnx")
            run([tools["build-model"], "--scale", str(k), name, path])
            seconds, rep = [], None
            for i in range(args.repeat):
                report = os.path.join(out, f"{name}-x{k}.json")
                cmd = [tools["optimize"], "--rules", args.rules, "--no-check", "--quiet",
                       "--json", report, "-o", os.path.join(out, f"{name}-x{k}.opt.onnx"), path]
                if args.no_pet:
                    cmd.insert(1, "--no-pet")
                run(cmd)
                with open(report) as f:
                    rep = json.load(f)
                seconds.append(rep["search"]["seconds"])
            s = statistics.median(seconds)
            ops = rep["operators_before"]
            rows.append({"model": name, "scale": k, "ops": ops, "ops_after": rep["operators_after"],
                         "windows": rep["search"]["windows"], "expanded": rep["search"]["expanded"],
                         "s": s, "s_min": min(seconds), "s_max": max(seconds),
                         "per100": 100 * s / ops if ops else 0.0,
                         "speedup": rep["cost_before_us"] / rep["cost_after_us"]
                         if rep["cost_after_us"] else 0.0})
            print(f"bench_scaling: {name} x{k}: {ops} operators, {s:.2f} s", file=sys.stderr)

    print(f"| model | scale | operators | after | windows | graphs expanded | search s "
          f"(median of {args.repeat}; min-max) | s per 100 operators | est. speedup |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['scale']} | {r['ops']} | {r['ops_after']} | {r['windows']} | "
              f"{r['expanded']} | {r['s']:.2f} ({r['s_min']:.2f}-{r['s_max']:.2f}) | "
              f"{r['per100']:.3f} | {r['speedup']:.3f} |")
    print()
    for name, _ in models:
        mine = [r for r in rows if r["model"] == name]
        lo, hi = mine[0], mine[-1]
        if hi is lo or lo["s"] <= 0:
            continue
        print(f"{name}: x{hi['scale']} over x{lo['scale']}: operators {hi['ops'] / lo['ops']:.2f}x, "
              f"search seconds {hi['s'] / lo['s']:.2f}x")
        # One window skips what several need (each window's bests finished
        # to choose the one that runs fastest), so growth past the first
        # size that has several is shown too.
        multi = next((r for r in mine if r["windows"] > 1), None)
        if lo["windows"] == 1 and multi and multi is not hi and multi["s"] > 0:
            print(f"{name}: x{hi['scale']} over x{multi['scale']} (the first of more than one "
                  f"window): operators {hi['ops'] / multi['ops']:.2f}x, search seconds "
                  f"{hi['s'] / multi['s']:.2f}x")


if __name__ == "__main__":
    main()
