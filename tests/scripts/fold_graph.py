#!/usr/bin/python3
"""fold_graph.py SEED OUT.onnx: one random small graph, the same for a seed, of the forms
Teq's import folds or fuses and look-alikes it must leave: convolutions (1, 2 or C groups,
1x1 or 3x3, padded or not, stride 1 or 2, dilation 1 or 2, with or without a bias, some
also read as a graph output), transposed convolutions (1 or C groups, 2x2 or 3x3, stride 1
or 2), linear layers along the last axis (MatMul, a bias of one value per column or per
row, some products also read as a graph output, some with a residual added) and
attention's queries, keys and values sliced from one product, the queries scaled (the
keys sometimes overlapping the queries' columns), among BatchNorms and Muls and Adds by a constant of one value, one per channel
or one per element (either operand first), relus, Paddle's hard swish written out in four
nodes and hard sigmoids of alpha 0.2, 1/6 and 0.25. Prints the input's name and shape
(NAME AxBxC). test_fold_fuzz.sh runs each through optimize and ONNX Runtime."""
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper, save


class Builder:
    def __init__(self, rng):
        self.rng, self.nodes, self.inits, self.k = rng, [], [], 0

    def name(self, prefix):
        self.k += 1
        return f"{prefix}{self.k}"

    def const(self, prefix, value):
        n = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32), n))
        return n

    def const_i64(self, prefix, value):
        n = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.int64), n))
        return n

    def node(self, op, inputs, prefix, **attrs):
        out = self.name(prefix)
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out


def affine_constant(r, c, h, w):
    """One value, one per channel (two spellings), or one per element: the last must stay."""
    kind = r.integers(0, 4)
    if kind == 0:
        return r.uniform(0.5, 2, [1])
    if kind == 1:
        return r.uniform(-2, 2, [1, c, 1, 1])
    if kind == 2:
        return r.uniform(-2, 2, [c, 1, 1])
    return r.uniform(-2, 2, [1, c, h, w])


def main():
    seed, path = int(sys.argv[1]), sys.argv[2]
    r = np.random.default_rng(seed)
    b = Builder(r)
    c, h, w, n = int(r.choice([2, 4, 6])), int(r.integers(3, 9)), int(r.integers(3, 9)), int(r.choice([1, 2]))
    shape, cur, outputs = [n, c, h, w], "x", []
    for _ in range(int(r.integers(3, 8))):
        step = r.integers(0, 8)
        if step <= 1:  # a convolution
            groups = int(r.choice([g for g in (1, 2, c) if c % g == 0]))
            m = groups * int(r.choice([1, 2]))
            k, pad, stride = int(r.choice([1, 1, 3])), int(r.integers(0, 2)), int(r.choice([1, 1, 2]))
            dilation = int(r.choice([1, 1, 2])) if k > 1 else 1
            span = (k - 1) * dilation + 1
            oh, ow = (h + 2 * pad - span) // stride + 1, (w + 2 * pad - span) // stride + 1
            if oh < 1 or ow < 1:
                continue
            weight = r.uniform(-1, 1, [m, c // groups, k, k]) / np.sqrt(c // groups * k * k)
            ins = [cur, b.const("w", weight)]
            if r.random() < 0.6:
                ins.append(b.const("b", r.uniform(-1, 1, [m])))
            cur = b.node("Conv", ins, "conv", group=groups, kernel_shape=[k, k], pads=[pad] * 4,
                         strides=[stride, stride], dilations=[dilation, dilation])
            c, h, w = m, oh, ow
            if r.random() < 0.2:  # read twice: nothing may fold into it
                outputs.append(cur)
        elif step == 4:  # a BatchNorm
            stats = [r.uniform(0.5, 2, [c]), r.uniform(-1, 1, [c]), r.uniform(-1, 1, [c]),
                     r.uniform(0.5, 2, [c])]
            cur = b.node("BatchNormalization", [cur] + [b.const(p, v) for p, v in
                                                         zip(("g", "beta", "mean", "var"), stats)],
                         "bn")
        elif step == 5:  # a transposed convolution
            groups = int(r.choice([1, c]))
            m = groups * int(r.choice([1, 2]))
            k, stride = int(r.choice([2, 3])), int(r.choice([1, 2])) if max(h, w) <= 6 else 1
            pad = int(r.integers(0, 2))
            oh, ow = (h - 1) * stride + k - 2 * pad, (w - 1) * stride + k - 2 * pad
            if oh < 1 or ow < 1:
                continue
            weight = r.uniform(-1, 1, [c, m // groups, k, k]) / np.sqrt(c // groups * k * k)
            ins = [cur, b.const("w", weight)]
            if r.random() < 0.5:
                ins.append(b.const("b", r.uniform(-1, 1, [m])))
            cur = b.node("ConvTranspose", ins, "convt", group=groups, kernel_shape=[k, k],
                         pads=[pad] * 4, strides=[stride, stride])
            c, h, w = m, oh, ow
        elif step == 6:  # a linear layer along the last axis: MatMul, a bias, maybe a
            # residual (x + (x W + b), its width kept), maybe a relu
            w2 = w if r.random() < 0.4 else int(r.integers(2, 9))
            weight = r.uniform(-1, 1, [w, w2]) / np.sqrt(w)
            before = cur
            prod = b.node("MatMul", [cur, b.const("lw", weight)], "mm")
            if r.random() < 0.2:  # read twice: the bias must stay an Add
                outputs.append(prod)
            # One per column, which fuses; one per row, which must stay.
            k = b.const("lb", r.uniform(-1, 1, [w2] if r.random() < 0.7 else [h, 1]))
            cur = b.node("Add", [prod, k] if r.random() < 0.5 else [k, prod], "lin")
            if w2 == w and r.random() < 0.7:
                if r.random() < 0.2:  # the sum before it read twice: the residual must stay
                    outputs.append(cur)
                cur = b.node("Add", [before, cur] if r.random() < 0.5 else [cur, before], "res")
            if r.random() < 0.5:
                cur = b.node("Relu", [cur], "relu")
            w = w2
        elif step == 7:  # attention's cut: queries, keys, values sliced from one product
            w2 = int(r.integers(2, 6))
            weight = r.uniform(-1, 1, [w, 3 * w2]) / np.sqrt(w)
            prod = b.node("MatMul", [cur, b.const("qkv", weight)], "qkv")
            k_from = w2 - 1 if r.random() < 0.3 else w2  # keys overlapping the queries: must stay
            parts = []
            for lo in (0, k_from, 2 * w2):
                parts.append(b.node("Slice", [prod, b.const_i64("lo", [lo]), b.const_i64("hi", [lo + w2]),
                                              b.const_i64("ax", [3])], "cut"))
            s = b.const("scale", float(r.choice([0.125, 0.3, 2.5])))
            parts[0] = b.node(str(r.choice(["Mul", "Div"])), [parts[0], s], "scaled")
            cur = b.node("Add", [b.node("Add", parts[:2], "qk"), parts[2]], "qkv_sum")
            w = w2
        elif step == 2:  # an affine: a Mul, an Add or both, the constant either side
            for op in (["Mul", "Add"] if r.random() < 0.5 else [str(r.choice(["Mul", "Add"]))]):
                k = b.const("s", affine_constant(r, c, h, w))
                cur = b.node(op, [cur, k] if r.random() < 0.5 else [k, cur], "aff")
        else:  # an activation
            kind = r.integers(0, 3)
            if kind == 0:
                cur = b.node("Relu", [cur], "relu")
            elif kind == 1:  # Paddle's hard swish: x * clip(x + 3, 0, 6) / 6
                three, zero, six = b.const("three", [3.0]), b.const("zero", 0.0), b.const("six", 6.0)
                shifted = b.node("Add", [cur, three], "add")
                clipped = b.node("Clip", [shifted, zero, six], "clip")
                cur = b.node("Div", [b.node("Mul", [cur, clipped], "mul"), six], "hswish")
            else:
                cur = b.node("HardSigmoid", [cur], "hsig", alpha=float(r.choice([0.2, 1 / 6, 0.25])))
    outputs.append(cur)
    graph = helper.make_graph(
        b.nodes, "fold_graph", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in dict.fromkeys(outputs)],
        b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    save(model, path)
    print("x", "x".join(map(str, shape)))


if __name__ == "__main__":
    main()
