#!/usr/bin/env python3
"""Compare a computed tensor with a reference tensor: the check behind every
"same outputs" claim (Teq vs PyTorch, ONNX Runtime vs Teq's exported model, ...).

    compare.py [--rtol R] [--elem-rtol E] [--floor F] [--label TEXT] GOT REF

GOT and REF are .pb (onnx.TensorProto) or raw little-endian float32 (.bin or any other
name); both are read as float32 and must have the same number of elements (and the
same dims when both are .pb). REF is the reference (for example PyTorch's output).

Metrics (printed on one line):
  max_abs   max_i |got_i - ref_i|
  rel       max_abs / max_i |ref_i|: the error relative to the tensor's scale. This is the
            pass criterion (rel <= --rtol, default 1e-4). Float32 kernels that sum in a
            different order differ by a few ulps of the large partial sums, so the error
            of an element tracks the magnitude of the tensor, not of that element;
            |a-b|/|b| alone would flag harmless noise on outputs close to zero.
  elem_rel  max_i |got_i - ref_i| / max(|ref_i|, floor), floor = F * max|ref|
            (F = --floor, default 1e-3): elementwise relative error, with values below
            0.1% of the tensor's scale compared against that floor instead of themselves.
            Reported always; a pass criterion only when --elem-rtol is given.
A NaN or infinity in either tensor where the other does not have the same value fails.
Exit status: 0 within tolerance, 1 outside it, 2 unreadable or incompatible files.
Needs numpy, and onnx for .pb files (Debian: /usr/bin/python3 with python3-onnx).
"""

import argparse
import os
import sys


def load(path, np):
    """Return (float32 flat array, dims or None)."""
    if path.endswith(".pb"):
        try:
            import onnx
            from onnx import numpy_helper
        except ImportError:
            raise ValueError(f"{path}: reading .pb needs the onnx package (python3-onnx)")
        t = onnx.TensorProto()
        with open(path, "rb") as f:
            data = f.read()
        try:
            t.ParseFromString(data)
            arr = numpy_helper.to_array(t)
        except Exception as e:  # protobuf raises several kinds
            raise ValueError(f"{path}: not a valid TensorProto ({e})")
        return arr.astype(np.float32).ravel(), list(arr.shape)
    size = os.path.getsize(path)
    if size % 4:
        raise ValueError(f"{path}: {size} bytes is not a whole number of float32 values")
    return np.fromfile(path, dtype="<f4"), None


def compare(got, ref, floor_frac, np):
    got64 = got.astype(np.float64)
    ref64 = ref.astype(np.float64)
    fin_g, fin_r = np.isfinite(got64), np.isfinite(ref64)
    # Non-finite values must match exactly (same inf sign; NaN against NaN).
    nonfinite_bad = int(np.sum((fin_g != fin_r) |
                               (~fin_g & ~fin_r & ~((got64 == ref64) |
                                                    (np.isnan(got64) & np.isnan(ref64))))))
    both = fin_g & fin_r
    g, r = got64[both], ref64[both]
    if g.size == 0:
        return dict(max_abs=0.0, rel=0.0, elem_rel=0.0, scale=0.0, worst=-1,
                    nonfinite_bad=nonfinite_bad)
    diff = np.abs(g - r)
    scale = float(np.max(np.abs(r)))
    max_abs = float(np.max(diff))
    rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    floor = floor_frac * scale if scale > 0 else 1e-30
    elem = diff / np.maximum(np.abs(r), floor)
    worst_both = int(np.argmax(elem))
    worst = int(np.flatnonzero(both)[worst_both])
    return dict(max_abs=max_abs, rel=rel, elem_rel=float(elem[worst_both]), scale=scale,
                worst=worst, nonfinite_bad=nonfinite_bad)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Metrics: see the module docstring (rel is the pass criterion).")
    ap.add_argument("got")
    ap.add_argument("ref")
    ap.add_argument("--rtol", type=float, default=1e-4,
                    help="bound on rel = max|got-ref| / max|ref| (default 1e-4)")
    ap.add_argument("--elem-rtol", type=float, default=None,
                    help="also bound elem_rel (default: report only)")
    ap.add_argument("--floor", type=float, default=1e-3,
                    help="elem_rel floor as a fraction of max|ref| (default 1e-3)")
    ap.add_argument("--label", default="", help="text to print before the result")
    args = ap.parse_args()

    try:
        import numpy as np
    except ImportError:
        print("compare.py: needs numpy (Debian: /usr/bin/python3 with python3-numpy)", file=sys.stderr)
        return 2
    try:
        got, got_dims = load(args.got, np)
        ref, ref_dims = load(args.ref, np)
    except (OSError, ValueError) as e:
        print(f"compare.py: {e}", file=sys.stderr)
        return 2
    if got.size != ref.size:
        print(f"compare.py: {args.got} has {got.size} elements, {args.ref} has {ref.size}",
              file=sys.stderr)
        return 2
    if got_dims is not None and ref_dims is not None and got_dims != ref_dims:
        print(f"compare.py: shapes differ: {args.got} {got_dims}, {args.ref} {ref_dims}",
              file=sys.stderr)
        return 2

    m = compare(got, ref, args.floor, np)
    ok = m["nonfinite_bad"] == 0 and m["rel"] <= args.rtol
    if args.elem_rtol is not None:
        ok = ok and m["elem_rel"] <= args.elem_rtol
    label = f"{args.label} " if args.label else ""
    extra = f" nonfinite_mismatch={m['nonfinite_bad']}" if m["nonfinite_bad"] else ""
    bound = f"rtol {args.rtol:.0e}" + (f", elem_rtol {args.elem_rtol:.0e}" if args.elem_rtol is not None else "")
    print(f"{'ok  ' if ok else 'FAIL'} {label}max_abs {m['max_abs']:.3e} rel {m['rel']:.3e} "
          f"elem_rel {m['elem_rel']:.3e} (n {got.size}, max|ref| {m['scale']:.4g}, "
          f"worst at {m['worst']}; {bound}){extra}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
