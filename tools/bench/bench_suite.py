#!/usr/bin/python3
"""The benchmark suite: the whole pipeline over the papers' models, in one run.

    bench_suite.py [--models a,b|all|zoo] [--depth 3 | --rules DB] [--budget N]
                   [--time-limit S] [--repeat N] [--gpu auto|on|off] [--ort auto|off]
                   [--record FILE] [--cost-table FILE] [--pet-models a,b|none] [--build DIR]
                   [--out DIR]
                   [--cache DIR] [--no-plot]

First gen-rules at --depth and verify-rules on its database (wall time, peak RSS and the
counts of each), unless --rules names a database made earlier. Then for every model (all:
the papers' suite; zoo: further torchvision architectures, see export_torchvision.py, and
PaddleOCR's trained models from the npm registry on a page of text, see fetch_npm.py):

  optimize    the model with those rules and PET (optimize's default; its JSON report:
              operators, estimated cost before and after, search time; its own end-to-end
              check on the CPU executor), and --as-given: the cost of the model with no
              import-time fusion (relus and BatchNorms as in the file), the baseline of the
              papers' speedups, beside ours from the fused import
  rules alone for the models of --pet-models (default: the four of PET's end-to-end
              benchmark, ResNet-18, CSRNet, Inception-v3 and BERT, and ResNeXt-50, whose
              strided grouped convolutions PET rewrites), optimize again with
              --no-pet: the second table sets rules + PET against the rules alone
  cpu         Teq's CPU executor (run-model) on the original and on the optimized model
  ort         ONNX Runtime (onnxruntime-node, CPU) on both, on the same input (where it is
              installed; --ort off leaves it out)
  diff        the largest relative output difference between the optimized model and the
              original: max |opt - orig| / max |orig| over every output, in ONNX Runtime
              (the independent oracle) and in Teq's executor; the larger is reported
  gpu         where run-model --gpu works: Teq's GPU runtime on both models, on the
              original as given (--as-given), and on the rules-alone model of the PET table, and for the models PyTorch has, the same
              module in eager mode and under torch.compile(mode="reduce-overhead"), strict
              float32, in the same run; beside it the speedup optimize's GPU verdict timed,
              both graphs in one process (where each convolution runs the same way in both)

Prints the table and writes OUT/results_suite.csv, OUT/results_suite.md and
OUT/results_suite.png (speedup per model beside the published figures of
tools/bench/published.tsv; needs gnuplot), and each model's optimize report as
OUT/reports/MODEL.json. --record FILE collects every operator
configuration optimize's cost model was asked about, for measuring on a GPU later
(teq-profile measure). Times are medians of --repeat runs after a
warm-up; on a shared CPU machine only the ratios measured in this one run mean anything.
SIGTERM stops the run after the model in progress is abandoned; the report of the models
finished is written as usual. Exit status: 0 when every step of every model ran and every optimized model computes what
its original does (diff <= --tolerance), 1 otherwise (the table is written either way),
2 bad arguments or a missing tool.
"""

import argparse
import csv
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools", "models"))
import export_torchvision as tv  # noqa: E402  (the torchvision models, their seeds and inputs)
import fetch_npm  # noqa: E402  (trained models from the npm registry, and their inputs)

# The suite, smallest first. "teq": built by build-model (models PyTorch has no builder
# for, written through Teq's own exporter); "torch": exported by export_torchvision.py;
# "npm": trained models fetched by fetch_npm.py.
SUITE = [
    ("tiny-cnn", "teq"),
    ("nasrnn", "teq"),
    ("squeezenet1_1", "torch"),
    ("transformer", "torch"),
    ("csrnet", "teq"),
    ("mobilenet_v2", "torch"),
    ("resnet18", "torch"),
    ("bert", "teq"),
    ("nasneta", "teq"),
    ("resnet50", "torch"),
    ("resnext50_32x4d", "torch"),
    ("inception_v3", "torch"),
    ("vgg19", "torch"),
]
# Further real models no paper measures (export_torchvision.py's zoo): --models zoo.
ZOO = [(name, "torch") for name in tv.ZOO] + [(name, "npm") for name in fetch_npm.MODELS]
BUILD_SEED = 1      # build-model --seed for the Teq-built models
INPUT_SEED = 1000   # their inputs: input i from numpy's PCG64 with seed INPUT_SEED + i


def log(msg):
    print(f"bench_suite: {msg}", file=sys.stderr, flush=True)


class Stopped(Exception):
    """SIGTERM: stop after writing the report of the models finished so far."""


def stop_on_sigterm(signum, frame):
    raise Stopped()


class Run:
    """One finished command: exit status, output files, wall seconds and peak RSS."""

    def __init__(self, rc, out, err, wall, rss_mb):
        self.rc, self.out, self.err, self.wall, self.rss_mb = rc, out, err, wall, rss_mb

    def stdout(self):
        with open(self.out, errors="replace") as f:
            return f.read()

    def tail(self, n=4):
        with open(self.err, errors="replace") as f:
            return " | ".join(f.read().strip().splitlines()[-n:])


def run(cmd, work, tag, timeout=1800, env=None):
    """Runs cmd with its output in files under work, and measures its own peak RSS
    (os.wait4 gives the rusage of that one child, not of every child so far)."""
    out, err = os.path.join(work, tag + ".out"), os.path.join(work, tag + ".err")
    t0 = time.monotonic()
    with open(out, "w") as fo, open(err, "w") as fe:
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env)
        try:
            while True:
                pid, status, usage = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    break
                if time.monotonic() - t0 > timeout:
                    p.send_signal(signal.SIGKILL)
                    pid, status, usage = os.wait4(p.pid, 0)
                    break
                time.sleep(0.02)
        except Stopped:  # the suite was told to stop: the child goes with it
            p.kill()
            p.wait()
            raise
    p.returncode = os.waitstatus_to_exitcode(status)  # so Popen's destructor stays quiet
    return Run(p.returncode, out, err, time.monotonic() - t0, usage.ru_maxrss / 1024.0)


def field(text, label):
    """The number after label on a line of a tool's summary ("  proved   306  100.0%")."""
    m = re.search(r"^\s*" + re.escape(label) + r"\s+([0-9.]+)", text, re.M)
    return float(m.group(1)) if m else None


def time_ms(text, pattern):
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else None


# ---- rules ----

def make_rules(args, work, tools):
    """gen-rules and verify-rules at args.depth; returns (database, rows of the rules table)."""
    db = os.path.join(work, f"rules_d{args.depth}.sqlite")
    log(f"gen-rules --depth {args.depth}")
    g = run([tools["gen-rules"], "--depth", str(args.depth), "--db", db, "--quiet"], work, "gen")
    if g.rc != 0:
        raise SystemExit(f"bench_suite: gen-rules failed (exit {g.rc}): {g.tail()}")
    gt = g.stdout()
    # The rules of products: a transpose absorbed into a GEMM's flags or
    # not, and a relu fused into the product it follows.
    lay = run([tools["gen-rules"], "--depth", "2", "--ops", "matmul,transpose,gemm,relu,matmul_relu",
               "--db", db, "--quiet"], work, "gen-products")
    if lay.rc != 0:
        raise SystemExit(f"bench_suite: gen-rules (products) failed (exit {lay.rc}): {lay.tail()}")
    log("verify-rules")
    v = run([tools["verify-rules"], "--db", db, "--quiet", os.path.join(REPO, "specs", "ops.axioms")],
            work, "verify")
    if v.rc != 0:
        raise SystemExit(f"bench_suite: verify-rules failed (exit {v.rc}): {v.tail()}")
    vt = v.stdout()
    rows = [
        {"step": "gen-rules", "depth": args.depth, "wall_s": g.wall, "peak_rss_mb": g.rss_mb,
         "counts": "%d graphs enumerated, %d candidate pairs, %d rules stored" % (
             field(gt, "graphs enumerated") or 0, field(gt, "candidate pairs (initial)") or 0,
             field(gt, "new rules stored") or 0)},
        {"step": "gen-rules (products: layouts through gemm, fused relu)", "depth": 2, "wall_s": lay.wall,
         "peak_rss_mb": lay.rss_mb,
         "counts": "%d rules stored" % (field(lay.stdout(), "new rules stored") or 0)},
        {"step": "verify-rules", "depth": args.depth, "wall_s": v.wall, "peak_rss_mb": v.rss_mb,
         "counts": "%d rules: %d proved, %d refuted, %d unknown" % (
             field(vt, "decided now") or 0, field(vt, "proved") or 0,
             field(vt, "refuted") or 0, field(vt, "unknown") or 0)},
    ]
    return db, rows


# ---- models and inputs ----

def prepare_teq_model(name, cache, tools, work, np, onnx):
    """build-model NAME into cache/NAME/model.onnx, with one seeded uniform [-1, 1)
    float32 input file per graph input; returns (model path, [(input name, file)])."""
    d = os.path.join(cache, name)
    path = os.path.join(d, "model.onnx")
    if not os.path.exists(path):
        os.makedirs(d, exist_ok=True)
        r = run([tools["build-model"], "--seed", str(BUILD_SEED), name, path + ".tmp"], work,
                f"{name}.build")
        if r.rc != 0:
            raise RuntimeError(f"build-model {name} failed (exit {r.rc}): {r.tail()}")
        os.replace(path + ".tmp", path)
    m = onnx.load(path, load_external_data=False)
    weights = {t.name for t in m.graph.initializer}
    inputs = []
    for i, vi in enumerate([v for v in m.graph.input if v.name not in weights]):
        tt = vi.type.tensor_type
        if tt.elem_type != onnx.TensorProto.FLOAT:
            raise RuntimeError(f"{name}: input {vi.name} is not float32")
        shape = [d.dim_value if d.dim_value > 0 else 1 for d in tt.shape.dim]
        f = os.path.join(d, f"input_{i}.bin")
        if not os.path.exists(f):
            x = np.random.default_rng(INPUT_SEED + i).uniform(-1, 1, shape).astype("<f4")
            x.tofile(f + ".tmp")
            os.replace(f + ".tmp", f)
        inputs.append((vi.name, f))
    return path, inputs


def prepare_torch_model(name, cache, work):
    r = run([sys.executable, os.path.join(REPO, "tools", "models", "export_torchvision.py"),
             cache, "--models", name], work, f"{name}.export")
    if r.rc != 0:
        raise RuntimeError(f"export_torchvision {name} failed (exit {r.rc}): {r.tail()}")
    d = os.path.join(cache, name)
    return os.path.join(d, "model.onnx"), [("input", os.path.join(d, "input_0.bin"))]


def prepare_npm_model(name, cache, work):
    r = run([sys.executable, os.path.join(REPO, "tools", "models", "fetch_npm.py"), cache,
             "--models", name], work, f"{name}.fetch")
    if r.rc != 0:
        raise RuntimeError(f"fetch_npm {name} failed (exit {r.rc}): {r.tail()}")
    d = os.path.join(cache, name)
    with open(os.path.join(d, "meta.json")) as f:
        input_name = json.load(f)["input"]
    return os.path.join(d, "model.onnx"), [(input_name, os.path.join(d, "input_0.bin"))]


def rel_diff(got_dir, ref_dir, np):
    """Largest max|got - ref| / max|ref| over the outputs two runs wrote; None when a run
    wrote none."""
    worst, j = None, 0
    while os.path.exists(os.path.join(ref_dir, f"output_{j}.bin")):
        g = os.path.join(got_dir, f"output_{j}.bin")
        if not os.path.exists(g):
            return float("inf")
        a = np.fromfile(g, dtype="<f4").astype(np.float64)
        b = np.fromfile(os.path.join(ref_dir, f"output_{j}.bin"), dtype="<f4").astype(np.float64)
        if a.shape != b.shape or not np.isfinite(a).all() or not np.isfinite(b).all():
            return float("inf")
        scale = np.abs(b).max()
        e = float(np.abs(a - b).max() / scale) if scale > 0 else float(np.abs(a - b).max())
        worst = e if worst is None else max(worst, e)
        j += 1
    return worst


# ---- one model ----

def bench_model(name, kind, args, tools, rules_db, work, mods, gpu):
    np, onnx = mods["numpy"], mods["onnx"]
    row = {"model": name, "status": "ok"}
    if kind == "teq":
        path, inputs = prepare_teq_model(name, args.cache, tools, work, np, onnx)
    elif kind == "npm":
        path, inputs = prepare_npm_model(name, args.cache, work)
    else:
        path, inputs = prepare_torch_model(name, args.cache, work)
    feed = [a for n, f in inputs for a in ("--input", f"{n}={f}")]
    opt = os.path.join(work, f"{name}.opt.onnx")
    report = os.path.join(work, f"{name}.report.json")

    log(f"{name}: optimize")
    extra = ["--record", os.path.join(work, f"{name}.configs")] if args.record else []
    extra += ["--cost-table", args.cost_table] if args.cost_table else []
    # a trained model's check on its own input: on noise a detector's map is e^-8 everywhere
    extra += feed if kind == "npm" else []
    r = run([tools["optimize"], "--rules", rules_db, "--budget", str(args.budget),
             "--time-limit", str(args.time_limit), "--as-given", "--json", report, *extra, "-o", opt,
             path],
            work, f"{name}.optimize")
    problems = []
    row["optimize_s"] = r.wall
    row["optimize_rss_mb"] = r.rss_mb
    if r.rc != 0 or not os.path.exists(report):
        row["status"] = f"optimize failed (exit {r.rc})"
        log(f"{name}: optimize failed (exit {r.rc}): {r.tail()}")
        return row
    with open(report) as f:
        rep = json.load(f)
    # kept beside the tables: which rewrites a figure rests on, after the GPU machine is gone
    os.makedirs(os.path.join(args.out, "reports"), exist_ok=True)
    shutil.copy(report, os.path.join(args.out, "reports", f"{name}.json"))
    row.update({
        "ops_before": rep["operators_before"], "ops_after": rep["operators_after"],
        "cost_before_us": rep["cost_before_us"], "cost_after_us": rep["cost_after_us"],
        "search_s": rep["search"]["seconds"],
        "rewrites": sum(a["times"] for a in rep["applied"]),
        "check_rel": rep["check"]["max_relative_error"],
    })
    if rep.get("as_given"):  # every import-time fusion off: the baseline of TASO's and Tensat's figures
        row["as_given_cost_us"] = rep["as_given"]["cost_us"]
    pet = rep.get("pet")
    if pet:
        row["pet_s"] = pet["seconds"]
        row["pet_mutants"] = pet["mutants"]
        row["pet_applied"] = sum(a["times"] for a in pet["applied"])
    if name in args.pet_models:
        log(f"{name}: optimize, rules alone (--no-pet)")
        alone = os.path.join(work, f"{name}.rules.report.json")
        table = ["--cost-table", args.cost_table] if args.cost_table else []
        a = run([tools["optimize"], "--rules", rules_db, "--no-pet", "--no-check", *table, "--budget",
                 str(args.budget), "--time-limit", str(args.time_limit), "--json", alone,
                 "-o", os.path.join(work, f"{name}.rules.onnx"), path], work, f"{name}.rules")
        if a.rc == 0 and os.path.exists(alone):
            with open(alone) as f:
                ra = json.load(f)
            row["rules_cost_after_us"] = ra["cost_after_us"]
            row["rules_search_s"] = ra["search"]["seconds"]
            row["rules_model"] = os.path.join(work, f"{name}.rules.onnx")
        else:
            problems.append(f"optimize --no-pet exit {a.rc}: {a.tail(2)}")
    if rep.get("gpu_ms"):  # optimize's own replay of both graphs, where it measured on a GPU
        row["opt_gpu_ms_before"], row["opt_gpu_ms_after"] = rep["gpu_ms"]["before"], rep["gpu_ms"]["after"]
        row["kept_original"] = rep.get("kept_original", False)
    src = rep["cost_sources_after"]
    row["cost_sources"] = "/".join(str(src.get(k, 0)) for k in ("measured", "table", "twin", "analytic"))
    # How much of the estimate after rests on the analytic model, not on measurements.
    row["analytic_us_after"] = rep.get("cost_us_by_source_after", {}).get("analytic")

    for which, model in (("before", path), ("after", opt)):
        log(f"{name}: CPU executor and ONNX Runtime, {which}")
        t = run([tools["run-model"], "--quiet", "--repeat", str(args.repeat), *feed,
                 "--output-dir", os.path.join(work, f"{name}.teq.{which}"), model],
                work, f"{name}.teq.{which}")
        row[f"cpu_ms_{which}"] = time_ms(t.stdout(), r"^time ([0-9.]+) ms") if t.rc == 0 else None
        if t.rc != 0:
            problems.append(f"run-model {which} exit {t.rc}: {t.tail(2)}")
        if not args.use_ort:
            continue
        o = run(["node", os.path.join(REPO, "tools", "ort", "run.js"), model, *feed, "--quiet",
                 "--repeat", str(args.repeat), "--output-dir",
                 os.path.join(work, f"{name}.ort.{which}")], work, f"{name}.ort.{which}")
        row[f"ort_ms_{which}"] = time_ms(o.stdout(), r"^time_ms ([0-9.]+)") if o.rc == 0 else None
        if o.rc != 0:
            problems.append(f"onnxruntime {which} exit {o.rc}: {o.tail(2)}")
    diffs = [rel_diff(os.path.join(work, f"{name}.{t}.after"),
                      os.path.join(work, f"{name}.{t}.before"), np) if t != "ort" or args.use_ort
             else None for t in ("ort", "teq")]
    row["diff_ort"], row["diff_teq"] = diffs
    known = [d for d in diffs if d is not None]
    row["max_rel_diff"] = max(known) if known else None
    if row["max_rel_diff"] is None or row["max_rel_diff"] > args.tolerance:
        problems.append(f"optimized model differs: {row['max_rel_diff']}")

    if gpu:
        bench_gpu_columns(name, kind, path, opt, feed, args, tools, work, mods, row, problems)
    if problems:
        row["status"] = "; ".join(problems)
    return row


def bench_gpu_columns(name, kind, path, opt, feed, args, tools, work, mods, row, problems):
    """Teq's GPU runtime on both models (and on the rules-alone one of the PET table) and,
    for PyTorch's models, eager and compiled."""
    timed = [("before", path, []), ("after", opt, []), ("given", path, ["--as-given"])]
    if row.get("rules_model"):
        timed.append(("rules", row["rules_model"], []))
    for which, model, flags in timed:
        log(f"{name}: GPU, {which}")
        g = run([tools["run-model"], "--gpu", "--quiet", "--warmup", "20", "--repeat",
                 str(args.gpu_repeat), *flags, *feed, model], work, f"{name}.gpu.{which}")
        row[f"gpu_ms_{which}"] = time_ms(g.stdout(), r"^time ([0-9.]+) ms") if g.rc == 0 else None
        if g.rc != 0:
            problems.append(f"run-model --gpu {which} exit {g.rc}: {g.tail(2)}")
    if kind != "torch" or "torch" not in mods:
        return
    import bench_gpu  # the same strict-float32 timing bench_gpu.py uses
    torch, torchvision, np = mods["torch"], mods["torchvision"], mods["numpy"]
    model = bench_gpu.build(name, torch, torchvision).cuda()
    x_np = np.fromfile(os.path.join(args.cache, name, "input_0.bin"), dtype="<f4")
    x = torch.from_numpy(x_np.reshape(tv.ALL[name][1]).copy()).cuda()
    row["eager_ms"], _ = bench_gpu.time_torch(model, x, torch, 20, args.gpu_repeat)
    torch._dynamo.reset()
    compiled = torch.compile(model, mode="reduce-overhead")
    row["compiled_ms"], _ = bench_gpu.time_torch(compiled, x, torch, 5, args.gpu_repeat)
    del compiled, model
    torch.cuda.empty_cache()


# ---- report ----

COLUMNS = [  # key, heading, format
    ("model", "model", "{}"),
    ("ops_before", "ops before", "{:.0f}"), ("ops_after", "ops after", "{:.0f}"),
    ("cost_before_us", "est. us before", "{:.1f}"), ("cost_after_us", "est. us after", "{:.1f}"),
    ("est_speedup", "est. speedup", "{:.3f}"),
    ("est_speedup_given", "est. speedup over as given", "{:.3f}"),
    ("search_s", "search s", "{:.1f}"), ("optimize_s", "optimize s", "{:.1f}"),
    ("cpu_ms_before", "Teq CPU ms before", "{:.2f}"), ("cpu_ms_after", "Teq CPU ms after", "{:.2f}"),
    ("ort_ms_before", "ORT ms before", "{:.2f}"), ("ort_ms_after", "ORT ms after", "{:.2f}"),
    ("max_rel_diff", "max rel diff", "{:.2g}"),
]
GPU_COLUMNS = [
    ("gpu_ms_before", "Teq GPU ms before", "{:.3f}"), ("gpu_ms_after", "Teq GPU ms after", "{:.3f}"),
    ("gpu_speedup", "GPU speedup", "{:.3f}"),
    ("gpu_speedup_one", "GPU speedup, one process", "{:.3f}"),
    ("gpu_speedup_given", "GPU speedup over as given", "{:.3f}"),
    ("eager_ms", "eager ms", "{:.3f}"), ("compiled_ms", "compiled ms", "{:.3f}"),
]
PET_COLUMNS = [  # the second table: rules + PET against the rules alone
    ("model", "model", "{}"),
    ("cost_before_us", "est. us before", "{:.1f}"),
    ("rules_cost_after_us", "est. us, rules", "{:.1f}"),
    ("cost_after_us", "est. us, rules + PET", "{:.1f}"),
    ("pet_gain", "rules + PET over rules", "{:.3f}"),
    ("pet_mutants", "PET mutants", "{:.0f}"), ("pet_applied", "PET applied", "{:.0f}"),
    ("rules_search_s", "search s, rules", "{:.1f}"), ("search_s", "search s, rules + PET", "{:.1f}"),
    ("pet_s", "of which PET s", "{:.1f}"),
]
PET_GPU_COLUMNS = [  # measured: the same three graphs on the GPU
    ("gpu_ms_before", "GPU ms before", "{:.3f}"), ("gpu_ms_rules", "GPU ms, rules", "{:.3f}"),
    ("gpu_ms_after", "GPU ms, rules + PET", "{:.3f}"),
    ("gpu_pet_gain", "measured rules + PET over rules", "{:.3f}"),
]
CSV_EXTRA = ["as_given_cost_us", "gpu_ms_given", "gpu_ms_rules", "opt_gpu_ms_before", "opt_gpu_ms_after", "rules_cost_after_us", "rules_search_s", "pet_mutants", "pet_applied", "pet_s", "rewrites", "cost_sources", "analytic_us_after", "check_rel", "diff_ort", "diff_teq", "optimize_rss_mb",
             "status"]


def fmt(row, key, spec):
    v = row.get(key)
    if v is None:
        return "-"
    if isinstance(v, float) and v != v:
        return "nan"
    return spec.format(v)


def load_published():
    """tools/bench/published.tsv: model, system, speedup %, source."""
    pub = {}
    with open(os.path.join(REPO, "tools", "bench", "published.tsv")) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            model, system, pct, source = line.rstrip("\n").split("\t")
            pub.setdefault(model, {})[system] = float(pct)
    return pub


def write_plot(rows, out, gpu):
    """A PNG of speedup per model (percent over the original graph) beside the papers'."""
    if not shutil.which("gnuplot"):
        log("gnuplot is not installed: no plot (Debian: apt-get install gnuplot-nox)")
        return None
    pub = load_published()
    series = [("Teq, estimated (cost model)", lambda r: pct(r.get("cost_before_us"), r.get("cost_after_us")))]
    if gpu:
        series.append(("Teq, measured on the GPU", lambda r: pct(r.get("gpu_ms_before"), r.get("gpu_ms_after"))))
    else:
        series.append(("Teq, measured in ONNX Runtime (CPU)",
                       lambda r: pct(r.get("ort_ms_before"), r.get("ort_ms_after"))))
    for system in ("TASO", "Tensat"):
        series.append((f"{system} (published, T4 GPU)",
                       lambda r, s=system: pub.get(r["model"], {}).get(s)))
    data = os.path.join(out, "results_suite.dat")
    with open(data, "w") as f:
        for r in rows:
            vals = [s[1](r) for s in series]
            f.write(r["model"] + "\t" + "\t".join("?" if v is None else f"{v:.2f}" for v in vals) + "\n")
    png = os.path.join(out, "results_suite.png")
    plots = ", ".join(f"'{data}' using {i + 2}:xtic(1) title '{s[0]}'" for i, s in enumerate(series))
    script = f"""
set terminal pngcairo size 1200,560 font ',10' noenhanced
set output '{png}'
set datafile separator '\\t'
set datafile missing '?'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set ylabel 'speedup of the optimized graph over the original (%)'
set title 'Teq against the published figures (TASO and Tensat: Tensat, MLSys 2021, Table 1)'
set xtics rotate by -30
set grid ytics
set key top right
set yrange [*:*]
plot {plots}
"""
    r = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
    if r.returncode != 0 and "pngcairo" in r.stderr:  # gnuplot built without cairo
        r = subprocess.run(["gnuplot"], input=script.replace("pngcairo", "png"), text=True,
                           capture_output=True)
    if r.returncode != 0:
        log(f"gnuplot failed: {r.stderr.strip()}")
        return None
    os.remove(data)
    return png


def pct(before, after):
    if not before or not after:
        return None
    return (before / after - 1.0) * 100.0


def describe_build(build):
    try:
        with open(os.path.join(build, "meson-info", "intro-buildoptions.json")) as f:
            opts = {o["name"]: o["value"] for o in json.load(f)}
    except (OSError, ValueError):
        return "unknown build"
    desc = f"buildtype={opts.get('buildtype')}, b_sanitize={opts.get('b_sanitize')}"
    if opts.get("b_sanitize", "none") != "none" or opts.get("optimization") in ("0", "g", "plain"):
        desc += " (WARNING: not an optimized non-sanitizer build; times mean little)"
    return desc


def machine():
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.*)$", f.read(), re.M)
            cpu = m.group(1) if m else cpu
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs"


def write_report(rows, rule_rows, args, gpu, out, header_notes):
    cols = COLUMNS + (GPU_COLUMNS if gpu else [])
    for r in rows:
        if r.get("cost_before_us") and r.get("cost_after_us"):
            r["est_speedup"] = r["cost_before_us"] / r["cost_after_us"]
        if r.get("as_given_cost_us") and r.get("cost_after_us"):
            r["est_speedup_given"] = r["as_given_cost_us"] / r["cost_after_us"]
        if r.get("gpu_ms_given") and r.get("gpu_ms_after"):
            r["gpu_speedup_given"] = r["gpu_ms_given"] / r["gpu_ms_after"]
        if r.get("rules_cost_after_us") and r.get("cost_after_us"):
            r["pet_gain"] = r["rules_cost_after_us"] / r["cost_after_us"]
        if r.get("gpu_ms_rules") and r.get("gpu_ms_after"):
            r["gpu_pet_gain"] = r["gpu_ms_rules"] / r["gpu_ms_after"]
        if r.get("gpu_ms_before") and r.get("gpu_ms_after"):
            r["gpu_speedup"] = r["gpu_ms_before"] / r["gpu_ms_after"]
        # optimize's verdict: both graphs planned in one process and timed in turn, so each
        # convolution runs the way that process chose for it in both, where two run-model
        # processes may choose apart (about 5% on the H200, 2026-11-27); the original kept: 1.
        if r.get("opt_gpu_ms_before") and r.get("opt_gpu_ms_after"):
            r["gpu_speedup_one"] = 1.0 if r.get("kept_original") else \
                r["opt_gpu_ms_before"] / r["opt_gpu_ms_after"]
    with open(os.path.join(out, "results_suite.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([c[0] for c in cols] + CSV_EXTRA)
        for r in rows:
            w.writerow([r.get(c[0], "") if r.get(c[0]) is not None else "" for c in cols] +
                       [r.get(k, "") if r.get(k) is not None else "" for k in CSV_EXTRA])
    lines = [f"# Benchmark suite ({datetime.date.today()})", ""]
    lines += [f"- {n}" for n in header_notes] + [""]
    if rule_rows:
        lines += ["| step | depth | wall s | peak RSS MB | counts |", "|---|---|---|---|---|"]
        lines += [f"| {r['step']} | {r['depth']} | {r['wall_s']:.1f} | {r['peak_rss_mb']:.0f} | "
                  f"{r['counts']} |" for r in rule_rows]
        lines.append("")
    lines.append("| " + " | ".join(c[1] for c in cols) + " |")
    lines.append("|" + "---|" * len(cols))
    for r in rows:
        lines.append("| " + " | ".join(fmt(r, *c[::2]) for c in cols) + " |")
    pet_rows = [r for r in rows if r.get("rules_cost_after_us") is not None]
    if pet_rows:
        pet_cols = PET_COLUMNS + (PET_GPU_COLUMNS if gpu else [])
        lines += ["", "PET: the same search with PET's mutants competing (optimize's default) "
                  "and with the rules alone (--no-pet)", ""]
        lines.append("| " + " | ".join(c[1] for c in pet_cols) + " |")
        lines.append("|" + "---|" * len(pet_cols))
        for r in pet_rows:
            lines.append("| " + " | ".join(fmt(r, *c[::2]) for c in pet_cols) + " |")
    bad = [r for r in rows if r["status"] != "ok"]
    if bad:
        lines.append("")
        lines += [f"- {r['model']}: {r['status']}" for r in bad]
    md = "\n".join(lines) + "\n"
    with open(os.path.join(out, "results_suite.md"), "w") as f:
        f.write(md)
    return md


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    names = [n for n, _ in SUITE]
    ap.add_argument("--models", default="all", help="comma-separated subset of: " + ", ".join(names)
                    + "; or zoo, or names from it: " + ", ".join(n for n, _ in ZOO))
    ap.add_argument("--depth", type=int, default=3, help="gen-rules depth (default 3)")
    ap.add_argument("--rules", help="a rule database made and verified earlier (skips gen/verify)")
    ap.add_argument("--budget", type=int, default=100, help="optimize --budget (default 100)")
    ap.add_argument("--time-limit", type=float, default=120, help="optimize --time-limit (default 120)")
    ap.add_argument("--repeat", type=int, default=10, help="timed CPU runs, median (default 10)")
    ap.add_argument("--gpu-repeat", type=int, default=200, help="timed GPU runs (default 200)")
    ap.add_argument("--gpu", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--ort", choices=("auto", "off"), default="auto",
                    help="ONNX Runtime columns: where onnxruntime-node is installed (auto) or never")
    ap.add_argument("--record", help="write every configuration optimize costed to this file")
    ap.add_argument("--cost-table", help="optimize --cost-table (default: optimize's own)")
    ap.add_argument("--pet-models", default="resnet18,csrnet,inception_v3,bert,resnext50_32x4d",
                    help="models also optimized with the rules alone (--no-pet), for the PET "
                    "table; 'none' for no second run (default: PET's end-to-end four and ResNeXt-50)")
    ap.add_argument("--tolerance", type=float, default=1e-4,
                    help="largest relative output difference allowed (default 1e-4)")
    ap.add_argument("--build", default=os.environ.get("TEQ_BENCH_BUILD", os.path.join(REPO, "build-release")))
    ap.add_argument("--out", default=os.environ.get("TEQ_BENCH_OUT", os.path.join(REPO, "tools", "bench")))
    ap.add_argument("--cache", default=os.environ.get("TEQ_CACHE", os.path.join(REPO, ".cache", "models")))
    ap.add_argument("--keep", action="store_true", help="keep the work directory (models, logs)")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args()

    chosen = names if args.models == "all" else [m.strip() for m in args.models.split(",") if m.strip()]
    chosen = [z for m in chosen for z in ([n for n, _ in ZOO] if m == "zoo" else [m])]
    names += [n for n, _ in ZOO]
    args.pet_models = [] if args.pet_models == "none" else \
        [m.strip() for m in args.pet_models.split(",") if m.strip()]
    unknown = [m for m in chosen + args.pet_models if m not in names]
    if unknown or not chosen:
        print(f"bench_suite: unknown model(s) {', '.join(unknown) or '(none given)'}; "
              f"the suite: {', '.join(names)}", file=sys.stderr)
        return 2
    if args.depth < 1 or args.repeat < 1 or args.budget < 0:
        print("bench_suite: --depth and --repeat must be at least 1, --budget at least 0", file=sys.stderr)
        return 2
    args.build, args.out, args.cache = (os.path.abspath(p) for p in (args.build, args.out, args.cache))
    # A build directory, or the flat tools/ of a GPU machine's staged binaries.
    tools = {}
    for d, t in (("gen", "gen-rules"), ("verify", "verify-rules"), ("optimize", "optimize"),
                 ("tools", "run-model"), ("tools", "build-model")):
        path = os.path.join(args.build, d, t)
        tools[t] = path if os.access(path, os.X_OK) else os.path.join(args.build, "tools", t)
    needed = [t for t in tools if not (args.rules and t in ("gen-rules", "verify-rules"))]
    missing = [tools[t] for t in needed if not os.access(tools[t], os.X_OK)]
    if missing:
        print(f"bench_suite: not built: {', '.join(missing)} (meson setup {args.build} "
              f"--buildtype=release -Db_ndebug=true && ninja -C {args.build})", file=sys.stderr)
        return 2
    if args.rules and not os.path.exists(args.rules):
        print(f"bench_suite: {args.rules}: no such rule database", file=sys.stderr)
        return 2
    args.use_ort = args.ort == "auto" and shutil.which("node") is not None and subprocess.run(
        ["node", "-e", "require('onnxruntime-node')"], cwd=os.path.join(REPO, "tools", "ort"),
        capture_output=True).returncode == 0
    if args.ort == "auto" and not args.use_ort:
        log("onnxruntime-node is missing, so no ONNX Runtime columns "
            "(set up: cd tools/ort && ONNXRUNTIME_NODE_INSTALL=skip npm ci)")
    mods = {}
    try:
        import numpy
        import onnx
        mods.update(numpy=numpy, onnx=onnx)
    except ImportError as e:
        print(f"bench_suite: {e} (Debian: apt-get install python3-onnx python3-numpy)", file=sys.stderr)
        return 2

    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.cache, exist_ok=True)
    work = tempfile.mkdtemp(prefix="teq-suite.")
    t_start = time.monotonic()
    try:
        gpu = False
        if args.gpu != "off":
            tiny = prepare_teq_model("tiny-cnn", args.cache, tools, work, numpy, onnx)[0]
            probe = run([tools["run-model"], "--gpu", "--quiet", "--repeat", "1", tiny],
                        work, "gpu-probe", timeout=300)
            gpu = probe.rc == 0
            if args.gpu == "on" and not gpu:
                print(f"bench_suite: --gpu on, but run-model --gpu fails: {probe.tail(2)}", file=sys.stderr)
                return 2
            if gpu:
                sys.path.insert(0, os.path.join(REPO, "tools", "bench"))
                try:
                    import torch
                    import torchvision
                    torch.backends.cuda.matmul.allow_tf32 = False
                    torch.backends.cudnn.allow_tf32 = False
                    torch.set_float32_matmul_precision("highest")
                    torch.backends.cudnn.benchmark = True
                    mods.update(torch=torch, torchvision=torchvision)
                except ImportError:
                    log("no PyTorch here: the GPU columns have Teq only")
        if args.rules:
            rules_db, rule_rows = os.path.abspath(args.rules), []
        else:
            rules_db, rule_rows = make_rules(args, work, tools)
        rows = []
        signal.signal(signal.SIGTERM, stop_on_sigterm)
        for i, name in enumerate(chosen):
            kind = dict(SUITE + ZOO)[name]
            t0 = time.monotonic()
            try:
                row = bench_model(name, kind, args, tools, rules_db, work, mods, gpu)
            except Stopped:  # a time limit outside: report what is finished
                rows += [{"model": n, "status": "not run: the suite was stopped (SIGTERM)"}
                         for n in chosen[i:]]
                log(f"stopped at {name}: the report has the models finished before it")
                break
            except Exception as e:  # one model's failure must not lose the others' figures
                row = {"model": name, "status": f"failed: {e}"}
            rows.append(row)
            log(f"{name}: {row['status']} ({time.monotonic() - t0:.0f} s)")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if args.record:
            configs = set()
            for name in chosen:
                f = os.path.join(work, f"{name}.configs")
                if os.path.exists(f):
                    with open(f) as fh:
                        configs.update(line.rstrip("\n") for line in fh if line.strip())
            with open(args.record, "w") as fh:
                fh.writelines(c + "\n" for c in sorted(configs))
            log(f"{len(configs)} configurations written to {args.record}")
        commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip() or "?"
        dirty = subprocess.run(["git", "-C", REPO, "diff", "--quiet"]).returncode != 0
        notes = [
            f"machine: {machine()}" + (", GPU: run-model --gpu" if gpu else ", no GPU"),
            f"commit {commit}{' (with local changes)' if dirty else ''}; build {describe_build(args.build)}",
            f"rules: {'depth %d, made in this run' % args.depth if not args.rules else args.rules}; "
            f"optimize --budget {args.budget} --time-limit {args.time_limit:g}"
            + (f" --cost-table {args.cost_table}" if args.cost_table else ""),
            f"CPU times: median of {args.repeat} runs after a warm-up, batch 1, each tool's default threads; "
            "est. = optimize's cost model (see its report for the source of each cost)",
            f"max rel diff: max |optimized - original| / max |original| over every output, "
            f"in {'ONNX Runtime and ' if args.use_ort else ''}Teq's executor; "
            f"tolerance {args.tolerance:g}",
            f"total {time.monotonic() - t_start:.0f} s",
        ]
        md = write_report(rows, rule_rows, args, gpu, args.out, notes)
        print(md, end="")
        if not args.no_plot:
            png = write_plot(rows, args.out, gpu)
            if png:
                print(f"plot: {png}")
        return 0 if all(r["status"] == "ok" for r in rows) else 1
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
