#!/usr/bin/env python3
"""Turn the raw timings that bench_cpu.sh collects into its table, CSV and Markdown.

    bench_report.py RAW.tsv --csv OUT.csv --md OUT.md [--note TEXT]...

RAW.tsv lines: model, threads ("all", "1", or "import"), tool, exit status, wall ms,
stdout file. Tools: teq (run-model), ort (tools/ort/run.js); for threads "import":
teq0 (run-model --repeat 0), teq1 (run-model --repeat 1), ort (one run.js run).

Times are read from the tools' stdout. run.js prints "time_ms M" and "load_ms L".
For run-model the reader accepts any line with a number followed by "ms", or a word
ending in "_ms" followed by a number: a line mentioning import/load/parse gives the
import time, any other the time per run (the last such line wins).
"""

import argparse
import csv
import os
import platform
import re
import sys
import time

NUM = r"([0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)"
RE_UNIT = re.compile(NUM + r"\s*ms\b")
RE_KEY = re.compile(r"\b([A-Za-z_]*_ms)\b[\s:=]+" + NUM)
RE_IMPORT = re.compile(r"(?i)import|load|pars")


def parse_times(path):
    """Returns (run_ms, import_ms), each None where not found."""
    run_ms = import_ms = None
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None, None
    for line in lines:
        m = RE_KEY.search(line)
        value = float(m.group(2)) if m else None
        if value is None:
            m = RE_UNIT.search(line)
            value = float(m.group(1)) if m else None
        if value is None:
            continue
        if RE_IMPORT.search(line):
            import_ms = value
        else:
            run_ms = value
    return run_ms, import_ms


def fmt(x, digits=2):
    return "n/a" if x is None else f"{x:.{digits}f}"


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw")
    ap.add_argument("--csv", required=True)
    ap.add_argument("--md", required=True)
    ap.add_argument("--note", action="append", default=[])
    args = ap.parse_args()

    rows = {}
    with open(args.raw) as f:
        for line in f:
            model, threads, tool, rc, wall, out = line.rstrip("\n").split("\t")
            run_ms, import_ms = parse_times(out) if rc == "0" else (None, None)
            rows[(model, threads, tool)] = dict(rc=int(rc), wall=float(wall), run=run_ms,
                                                imp=import_ms)

    table = []  # model, threads, teq ms, ort ms, ratio
    order = []
    for (model, threads, _tool) in rows:
        if threads != "import" and (model, threads) not in order:
            order.append((model, threads))
    for model, threads in order:
        teq = rows.get((model, threads, "teq"), {}).get("run")
        ort = rows.get((model, threads, "ort"), {}).get("run")
        ratio = teq / ort if teq is not None and ort else None
        table.append((model, threads, teq, ort, ratio))

    # Import of resnet50.
    imp_notes = []
    imp = None
    t0 = rows.get(("resnet50", "import", "teq0"))
    t1 = rows.get(("resnet50", "import", "teq1"))
    o = rows.get(("resnet50", "import", "ort"))
    if t0 and t0["rc"] == 0:
        imp = t0["imp"] if t0["imp"] is not None else t0["wall"]
        how = ("as reported by run-model --repeat 0" if t0["imp"] is not None else
               "wall time of run-model --repeat 0 (process start, import, reading the input)")
        imp_notes.append(f"Teq import of resnet50: {imp:.1f} ms, {how}")
    elif t1 and t1["rc"] == 0:
        if t1["imp"] is not None:
            imp = t1["imp"]
            imp_notes.append(f"Teq import of resnet50: {imp:.1f} ms, as reported by run-model "
                             "(--repeat 0 not supported)")
        elif t1["run"] is not None:
            imp = t1["wall"] - 2 * t1["run"]  # --repeat 1: a warm-up run and a timed run
            imp_notes.append(f"Teq import of resnet50: {imp:.1f} ms, estimated as the wall time of "
                             "run-model --repeat 1 minus two runs (warm-up + timed; "
                             "--repeat 0 not supported)")
    if imp is None:
        imp_notes.append("Teq import of resnet50: not measured (run-model failed)")
    ort_load = o["imp"] if o and o["rc"] == 0 else None
    imp_notes.append(f"ONNX Runtime session creation for resnet50: {fmt(ort_load, 1)} ms")

    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    host = f"{cpu_name()}, {os.cpu_count()} logical CPUs"

    with open(args.csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "threads", "teq_ms", "ort_ms", "ratio_teq_over_ort"])
        for model, threads, teq, ort, ratio in table:
            w.writerow([model, threads, fmt(teq, 3), fmt(ort, 3), fmt(ratio, 3)])
        w.writerow(["resnet50", "import", fmt(imp, 1), fmt(ort_load, 1), ""])

    head = ["model", "threads", "teq ms", "ort ms", "teq/ort"]
    body = [[m, th, fmt(a), fmt(b), fmt(r)] for m, th, a, b, r in table]
    with open(args.md, "w") as f:
        f.write(f"# CPU executor vs ONNX Runtime\n\n{stamp}; {host}\n\n")
        for n in args.note:
            f.write(f"- {n}\n")
        f.write("\n| " + " | ".join(head) + " |\n|" + "|".join("---" for _ in head) + "|\n")
        for r in body:
            f.write("| " + " | ".join(r) + " |\n")
        f.write("\n" + "".join(f"- {n}\n" for n in imp_notes))
        f.write("\nteq/ort > 1: Teq is slower. Times are the median per run, batch 1, float32.\n")

    widths = [max(len(str(r[i])) for r in [head] + body) for i in range(len(head))]
    print(f"{stamp}; {host}")
    for n in args.note:
        print(n)
    for r in [head] + body:
        print("  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in
                        enumerate(zip(r, widths))))
    for n in imp_notes:
        print(n)
    print(f"wrote {args.csv} and {args.md}")
    return 0 if all(t[2] is not None and t[3] is not None for t in table) and imp is not None else 1


if __name__ == "__main__":
    sys.exit(main())
