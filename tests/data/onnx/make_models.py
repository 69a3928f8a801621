#!/usr/bin/python3
"""make_models.py: writes the small ONNX models tests/runtime/test_onnx.c imports.

Run from anywhere with Debian's /usr/bin/python3 (python3-onnx, numpy); it
rewrites the files beside itself. Weights come from a fixed seed, so the
output is the same every time. Expected outputs are computed here with numpy
(a reference independent of Teq) and stored as TensorProto files:
NAME.input_0.pb and NAME.output_0.pb. Bad models each break exactly one rule.
"""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
RNG = np.random.default_rng(20240501)


def rand(*shape):
    return RNG.uniform(-1, 1, size=shape).astype(np.float32)


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def const_node(name, array):
    return helper.make_node("Constant", [], [name], value=init(name + "_value", array))


def save(name, graph, opset=13, check=True):
    model = helper.make_model(graph, producer_name="teq-tests",
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    if check:
        onnx.checker.check_model(model, full_check=True)
    onnx.save(model, os.path.join(HERE, name + ".onnx"))


def save_tensor(name, array, tensor_name):
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(numpy_helper.from_array(np.asarray(array), tensor_name).SerializeToString())


# ---- numpy reference kernels ----

def conv2d(x, w, b, pad):
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    y = np.zeros((n, m, oh, ow), np.float64)
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i:i + kh, j:j + kw].astype(np.float64)
            y[:, :, i, j] = np.einsum("nchw,mchw->nm", patch, w.astype(np.float64))
    return y + b.reshape(1, m, 1, 1)


def maxpool2(x):
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ---- good models ----

def conv_bn():
    """Conv -> BatchNormalization -> Relu -> MaxPool -> Identity -> reshape
    to [N, -1] through a Shape subgraph -> Gemm -> Dropout -> Softmax, with a
    symbolic batch dimension."""
    x = rand(1, 3, 8, 8)
    w, b = rand(4, 3, 3, 3), rand(4)
    gamma, beta, mean = rand(4) + 1.5, rand(4), rand(4)
    var = np.abs(rand(4)) + 0.5
    w2, b2 = rand(10, 64), rand(10)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1],
                         kernel_shape=[3, 3]),
        helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["bn"],
                         name="bn", epsilon=1e-3),
        helper.make_node("Relu", ["bn"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Identity", ["p"], ["p_id"], name="identity"),
        helper.make_node("Shape", ["p_id"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "zero"], ["n"], name="gather", axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"], name="unsqueeze"),
        helper.make_node("Concat", ["n1", "minus_one"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["p_id", "target"], ["flat"], name="reshape"),
        helper.make_node("Gemm", ["flat", "w2", "b2"], ["fc"], name="fc", transB=1),
        helper.make_node("Dropout", ["fc"], ["drop"], name="dropout"),
        helper.make_node("Softmax", ["drop"], ["y"], name="softmax", axis=1),
    ]
    inits = [init("w", w), init("b", b), init("gamma", gamma), init("beta", beta),
             init("mean", mean), init("var", var), init("zero", np.array(0, np.int64)),
             init("axes0", np.array([0], np.int64)), init("minus_one", np.array([-1], np.int64)),
             init("w2", w2), init("b2", b2)]
    graph = helper.make_graph(
        nodes, "conv_bn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    save("conv_bn", graph)
    c = conv2d(x, w, b, 1)
    s = (gamma / np.sqrt(var + 1e-3)).reshape(1, 4, 1, 1)
    bn = (c - mean.reshape(1, 4, 1, 1)) * s + beta.reshape(1, 4, 1, 1)
    p = maxpool2(np.maximum(bn, 0))
    y = softmax(p.reshape(1, -1) @ w2.T.astype(np.float64) + b2)
    save_tensor("conv_bn.input_0.pb", x, "x")
    save_tensor("conv_bn.output_0.pb", y.astype(np.float32), "y")


def shape_fold(opset):
    """Every int64 operator fold.c evaluates, computing the target of a
    Reshape and two float constants, plus a float constant subgraph (Add of
    two constants) that the registry's kernel folds. Before opset 13,
    Unsqueeze and Squeeze take their axes as an attribute."""
    x = rand(2, 3, 4)
    ca, cb = rand(12), rand(12)
    n = helper.make_node

    def axes_node(op, data, out):
        if opset >= 13:
            return n(op, [data, "axes0"], [out])
        return n(op, [data], [out], axes=[0])

    nodes = [
        n("Shape", ["x"], ["s"]),                                   # [2, 3, 4]
        n("Slice", ["s", "one", "three"], ["s12"]),                 # [3, 4]
        n("ReduceProd", ["s12"], ["p"], keepdims=1),                # [12]
        n("Gather", ["s", "zero"], ["d0"], axis=0),                 # 2
        axes_node("Unsqueeze", "d0", "d0v"),                        # [2]
        n("Concat", ["d0v", "p"], ["t0"], axis=0),                  # [2, 12]
        n("Cast", ["t0"], ["t1"], to=TensorProto.INT64),
        n("Mul", ["t1", "one"], ["t2"]),
        n("Div", ["t2", "one"], ["t3"]),
        n("Add", ["t3", "zero"], ["t4"]),
        n("Sub", ["t4", "zero"], ["t5"]),
        n("Max", ["t5", "zero"], ["t6"]),
        n("Min", ["t6", "big"], ["t7"]),
        n("Equal", ["t7", "t0"], ["same"]),
        n("Shape", ["t0"], ["t0s"]),                                # [2]
        n("ConstantOfShape", ["t0s"], ["zeros_i"], value=init("v", np.array([0], np.int64))),
        n("Where", ["same", "t7", "zeros_i"], ["t8"]),
        axes_node("Unsqueeze", "t8", "t9"),                         # [1, 2]
        axes_node("Squeeze", "t9", "target"),                       # [2]
        n("Reshape", ["x", "target"], ["xr"]),                      # x as [2, 12]
        n("ConstantOfShape", ["target"], ["half"], value=init("h", np.array([0.5], np.float32))),
        n("Add", ["xr", "half"], ["y1"]),
        n("Constant", [], ["twelve"], value_int=12) if opset >= 12
        else const_node("twelve", np.array(12, np.int64)),
        n("Range", ["zero", "twelve", "one_s"], ["r"]),             # 0..11
        n("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
        n("Expand", ["rf", "target"], ["rfe"]),                     # [2, 12]
        n("Identity", ["rfe"], ["rfe2"]),
        n("Mul", ["y1", "rfe2"], ["y2"]),
        const_node("ca", ca),
        n("Add", ["ca", "cb"], ["k"]),                              # folded by the registry
        n("Mul", ["y2", "k"], ["y"]),
    ]
    inits = [init("one", np.array([1], np.int64)), init("one_s", np.array(1, np.int64)),
             init("three", np.array([3], np.int64)), init("zero", np.array(0, np.int64)),
             init("axes0", np.array([0], np.int64)), init("big", np.array([1 << 40], np.int64)),
             init("cb", cb)]
    name = "shape_fold" if opset >= 13 else "shape_fold_opset%d" % opset
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 12])], inits)
    save(name, graph, opset=opset)
    y = (x.reshape(2, 12) + 0.5) * np.arange(12, dtype=np.float32) * (ca + cb)
    save_tensor(name + ".input_0.pb", x, "x")
    save_tensor(name + ".output_0.pb", y.astype(np.float32), "y")


def unsorted():
    """A valid model whose nodes are listed out of topological order."""
    w = rand(4, 5)
    nodes = [
        helper.make_node("Tanh", ["h"], ["y"], name="last"),
        helper.make_node("Add", ["m", "bias"], ["h"], name="middle"),
        helper.make_node("MatMul", ["x", "w"], ["m"], name="first"),
    ]
    graph = helper.make_graph(
        nodes, "unsorted", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])],
        [init("w", w), init("bias", np.full(5, 0.25, np.float32))])
    save("unsorted", graph, check=False)  # the checker insists on sorted nodes
    x = rand(3, 4)
    save_tensor("unsorted.input_0.pb", x, "x")
    save_tensor("unsorted.output_0.pb", np.tanh(x @ w + 0.25).astype(np.float32), "y")


def opaque():
    """Operators Teq does not know (Sin, Cos, CumSum, Hardmax) between known
    ones; one output is declared in value_info, CumSum's is not."""
    nodes = [
        helper.make_node("Sin", ["x"], ["s"], name="sin"),
        helper.make_node("Relu", ["s"], ["r"], name="relu"),
        helper.make_node("Cos", ["r"], ["c"], name="cos"),
        helper.make_node("Sin", ["c"], ["s2"], name="sin2"),
        helper.make_node("CumSum", ["s2", "axis"], ["cs"], name="cumsum"),
        helper.make_node("Hardmax", ["cs"], ["y"], name="hardmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "opaque", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [init("axis", np.array(1, np.int64))],
        value_info=[helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 4])])
    save("opaque", graph)


def opaque_types():
    """Operators Teq does not know that read and write bool: Greater of a
    computed value, Not, Where on a constant bool mask, Cast back to float.
    Teq holds bool as int64, so export must give each one the type it read
    (a Cast before Where's mask). A Cast of x to its own type is no node."""
    x = rand(2, 3)
    mask = np.array([[True, False, True], [False, True, True]])
    n = helper.make_node
    nodes = [
        n("Greater", ["x", "zero"], ["pos"], name="greater"),
        n("Not", ["pos"], ["neg"], name="not"),
        n("Cast", ["neg"], ["negf"], name="cast", to=TensorProto.FLOAT),
        n("Where", ["mask", "x", "negf"], ["w"], name="where"),
        n("Cast", ["x"], ["xs"], name="same_type", to=TensorProto.FLOAT),
        n("Add", ["w", "xs"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes, "opaque_types", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [init("zero", np.array(0, np.float32)), init("mask", mask)])
    save("opaque_types", graph)
    y = np.where(mask, x, (x <= 0).astype(np.float32)) + x
    save_tensor("opaque_types.input_0.pb", x, "x")
    save_tensor("opaque_types.output_0.pb", y.astype(np.float32), "y")


def custom_domain():
    """An operator of a custom domain, which import keeps opaque and export
    writes back with its domain's opset."""
    nodes = [
        helper.make_node("Frobnicate", ["x"], ["f"], name="frob", domain="com.example.teq",
                         strength=3),
        helper.make_node("Relu", ["f"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes, "custom_domain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        value_info=[helper.make_tensor_value_info("f", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, producer_name="teq-tests",
                              opset_imports=[helper.make_opsetid("", 13),
                                             helper.make_opsetid("com.example.teq", 2)])
    model.ir_version = 7
    onnx.save(model, os.path.join(HERE, "custom_domain.onnx"))


# ---- bad models: each breaks one rule ----

def bad_models():
    f = TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    # A node reads a name nothing defines.
    save("bad_missing_init", helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
        [vi("x", f, [2, 3])], [vi("y", f, [2, 5])]), check=False)
    # MatMul of [2, 3] by [4, 5].
    save("bad_shape_mismatch", helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")], "g",
        [vi("a", f, [2, 3]), vi("b", f, [4, 5])], [vi("y", f, [2, 5])]), check=False)
    # Conv with auto_pad="FOO".
    save("bad_auto_pad", helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", auto_pad="FOO")], "g",
        [vi("x", f, [1, 2, 5, 5])], [vi("y", f, [1, 2, 3, 3])],
        [init("w", rand(2, 2, 3, 3))]), check=False)
    # MaxPool whose Indices output (column-major: storage_order=1) is a graph output.
    save("bad_maxpool_indices", helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["y", "i"], name="pool", kernel_shape=[2, 2],
                          storage_order=1)], "g",
        [vi("x", f, [1, 1, 4, 4])],
        [vi("y", f, [1, 1, 3, 3]), vi("i", TensorProto.INT64, [1, 1, 3, 3])]), check=False)
    # An attribute of the wrong type: group as a float.
    save("bad_attr_type", helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", group=1.0)], "g",
        [vi("x", f, [1, 2, 5, 5])], [vi("y", f, [1, 2, 3, 3])],
        [init("w", rand(2, 2, 3, 3))]), check=False)
    # Two nodes feeding each other.
    save("bad_cycle", helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["a"], name="first"),
         helper.make_node("Relu", ["a"], ["b"], name="second")], "g",
        [vi("x", f, [2])], [vi("b", f, [2])]), check=False)


def bad_robustness():
    """Bad models a fuzzer found to crash, overflow or fail without a message;
    each must be refused with one that names the node or input at fault.
    No random weights: RNG draws here would change every model after."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    vi = helper.make_tensor_value_info
    x = [vi("x", f, [1, 3, 8, 8])]
    y = [vi("y", f, None)]
    # A node without op_type (proto2 leaves the string unset).
    relu = helper.make_node("Relu", ["x"], ["y"], name="anon")
    relu.ClearField("op_type")
    save("bad_no_op_type", helper.make_graph([relu], "g", x, y), check=False)
    # A Cast whose one attribute has no name.
    cast = helper.make_node("Cast", ["x"], ["y"], name="cast", to=f)
    cast.attribute[0].ClearField("name")
    save("bad_attr_no_name", helper.make_graph([cast], "g", x, y), check=False)
    # An empty ints attribute: Conv strides=[].
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="conv")
    conv.attribute.append(onnx.AttributeProto(name="strides", type=onnx.AttributeProto.INTS))
    save("bad_empty_ints", helper.make_graph(
        [conv], "g", x, y, [init("w", np.full((4, 3, 3, 3), 0.5, np.float32))]), check=False)
    # A Conv weight of rank 1.
    save("bad_conv_weight_rank", helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], "g", x, y,
        [init("w", np.full(3, 0.5, np.float32))]), check=False)
    # Constants that do not add: the registry's fold fails, the node is then refused.
    save("bad_const_add", helper.make_graph(
        [helper.make_node("Add", ["b", "c"], ["d"], name="add"),
         helper.make_node("Add", ["x", "d"], ["y"], name="add2")], "g", x, y,
        [init("b", np.full(3, 0.5, np.float32)), init("c", np.full(5, 0.5, np.float32))]),
        check=False)
    # A Relu without inputs.
    save("bad_no_inputs", helper.make_graph(
        [helper.make_node("Relu", [], ["y"], name="relu")], "g", [], y), check=False)
    # An input of 2^65 elements.
    save("bad_input_too_large", helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
        [vi("x", f, [1 << 21, 1 << 21, 1 << 21, 4])], y), check=False)
    # Reshape targets whose product overflows, and a -1 among zero elements.
    save("bad_reshape_overflow", helper.make_graph(
        [helper.make_node("Reshape", ["c", "s"], ["y"], name="reshape")], "g", [], y,
        [init("c", np.full(4, 0.5, np.float32)),
         init("s", np.array([1 << 62, 1 << 62, 0, -1], np.int64))]), check=False)
    save("bad_reshape_empty", helper.make_graph(
        [helper.make_node("Reshape", ["c", "s"], ["y"], name="reshape")], "g", [], y,
        [init("c", np.zeros(0, np.float32)), init("s", np.array([0, -1], np.int64))]),
        check=False)
    # An empty initializer whose other extents multiply past int64.
    save("bad_init_empty_huge", helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"], name="add")], "g", x, y,
        [TensorProto(name="w", data_type=f, dims=[0, 1 << 62, 1 << 62])]), check=False)
    # Results of 4 TB, of 2^62 x 2^62 x 0 and of 768 TB.
    save("bad_constant_of_shape", helper.make_graph(
        [helper.make_node("ConstantOfShape", ["s"], ["c"], name="fill"),
         helper.make_node("Add", ["x", "c"], ["y"])], "g", x, y,
        [init("s", np.array([1 << 40], np.int64))]), check=False)
    # 900 GB: under the 2^40-byte bound on any tensor, over any test machine's memory.
    save("bad_constant_of_shape_huge", helper.make_graph(
        [helper.make_node("ConstantOfShape", ["s"], ["c"], name="fill"),
         helper.make_node("Add", ["x", "c"], ["y"])], "g", x, y,
        [init("s", np.array([225 * 10 ** 9], np.int64))]), check=False)
    save("bad_constant_of_shape_empty", helper.make_graph(
        [helper.make_node("ConstantOfShape", ["s"], ["c"], name="fill"),
         helper.make_node("Shape", ["c"], ["y"])], "g", x, [vi("y", i64, None)],
        [init("s", np.array([1 << 62, 1 << 62, 0], np.int64))]), check=False)
    save("bad_tile_large", helper.make_graph(
        [helper.make_node("Tile", ["x", "r"], ["y"], name="tile")], "g", x, y,
        [init("r", np.array([1 << 40, 1, 1, 1], np.int64))]), check=False)
    save("bad_expand_large", helper.make_graph(
        [helper.make_node("Expand", ["x", "s"], ["y"], name="expand")], "g", x, y,
        [init("s", np.array([1 << 31, 1 << 31, 1 << 31, 3, 8, 8], np.int64))]), check=False)
    # A fourth input to Gemm and to Conv: ONNX has none, Teq's residual is its own.
    m = [vi("m", f, [2, 3])]
    save("bad_gemm_four_inputs", helper.make_graph(
        [helper.make_node("Gemm", ["m", "b", "c", "z"], ["y"], name="gemm")], "g", m, y,
        [init("b", np.full((3, 4), 0.5, np.float32)), init("c", np.full(4, 0.5, np.float32)),
         init("z", np.full((2, 4), 0.5, np.float32))]), check=False)
    save("bad_conv_four_inputs", helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b", "z"], ["y"], name="conv")], "g", x, y,
        [init("w", np.full((4, 3, 1, 1), 0.5, np.float32)), init("b", np.full(4, 0.5, np.float32)),
         init("z", np.full((1, 4, 8, 8), 0.5, np.float32))]), check=False)


def int_extremes():
    """Shape bookkeeping at the ends of int64, all of it valid: Slices with
    steps INT64_MAX and INT64_MIN (one element each) and a Range from
    -2^63 + 1 to 2^63 - 1 by 2^62, whose third value is 1."""
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    nodes = [
        helper.make_node("Slice", ["cst", "zero", "max", "zero", "max"], ["first"]),
        helper.make_node("Slice", ["cst", "max", "min", "zero", "min"], ["last"]),
        helper.make_node("Range", ["r_start", "r_limit", "r_delta"], ["r"]),
        helper.make_node("Gather", ["r", "two"], ["third"]),
        helper.make_node("Concat", ["first", "last", "third"], ["vals"], axis=0),
        helper.make_node("Cast", ["vals"], ["valsf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "valsf"], ["y"]),
    ]
    inits = [init("cst", np.arange(10, dtype=np.int64) * 10),
             init("zero", np.array([0], np.int64)), init("max", np.array([hi], np.int64)),
             init("min", np.array([lo], np.int64)), init("two", np.array([2], np.int64)),
             init("r_start", np.array(lo + 1, np.int64)), init("r_limit", np.array(hi, np.int64)),
             init("r_delta", np.array(1 << 62, np.int64))]
    graph = helper.make_graph(
        nodes, "int_extremes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], inits)
    save("int_extremes", graph)
    x = np.array([0.25, -0.5, 2.0], np.float32)
    save_tensor("int_extremes.input_0.pb", x, "x")
    save_tensor("int_extremes.output_0.pb", (x + np.array([0, 90, 1], np.float32)), "y")


def layer_norm_written():
    """A layer normalization over the last axis written out in nine operators,
    as PyTorch exports one below opset 17, followed by a Relu so that the
    normalization is not the graph's output; the last axis only of [2, 3, 8]."""
    gamma, beta = rand(8), rand(8)
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], name="mean", axes=[-1], keepdims=1),
        helper.make_node("Sub", ["x", "mean"], ["d"], name="sub"),
        helper.make_node("Pow", ["d", "two"], ["d2"], name="pow"),
        helper.make_node("ReduceMean", ["d2"], ["var"], name="var", axes=[-1], keepdims=1),
        helper.make_node("Add", ["var", "eps"], ["ve"], name="add_eps"),
        helper.make_node("Sqrt", ["ve"], ["sd"], name="sqrt"),
        helper.make_node("Div", ["d", "sd"], ["n"], name="div"),
        helper.make_node("Mul", ["n", "gamma"], ["s"], name="scale"),
        helper.make_node("Add", ["s", "beta"], ["ln"], name="shift"),
        helper.make_node("Relu", ["ln"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes, "layer_norm_written",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 8])],
        [init("two", np.float32(2.0)), init("eps", np.float32(1e-5)), init("gamma", gamma),
         init("beta", beta)])
    save("layer_norm_written", graph)
    x = rand(2, 3, 8)
    xd = x.astype(np.float64)
    mean = xd.mean(axis=-1, keepdims=True)
    var = ((xd - mean) ** 2).mean(axis=-1, keepdims=True)
    y = np.maximum((xd - mean) / np.sqrt(var + 1e-5) * gamma + beta, 0)
    save_tensor("layer_norm_written.input_0.pb", x, "x")
    save_tensor("layer_norm_written.output_0.pb", y.astype(np.float32), "y")


def scatter_dropout():
    """Exporter bookkeeping as Swin's shifted windows write it (opset 16): a
    Reshape target computed from Shape by two int64 ScatterNDs (reduction add,
    then none), a float mask made by ScatterND into ConstantOfShape, and two
    Dropouts whose mask outputs nothing reads, one in training mode at ratio
    0 (the identity, as F.dropout(p=0.0, training=True) exports)."""
    x, rows = rand(2, 6, 4), rand(2, 8)
    n = helper.make_node
    nodes = [
        n("Shape", ["x"], ["s"]),                                           # [2, 6, 4]
        n("ScatterND", ["s", "ix1", "minus3"], ["s2"], reduction="add"),    # [2, 3, 4]
        n("ScatterND", ["s2", "ix2", "eight"], ["target"]),                 # [2, 3, 8]
        n("Reshape", ["x", "target"], ["xr"]),
        n("ConstantOfShape", ["mask_shape"], ["zeros"],
          value=numpy_helper.from_array(np.zeros(1, np.float32), "v")),
        n("ScatterND", ["zeros", "rows_ix", "rows"], ["mask"]),              # [3, 8]
        n("Add", ["xr", "mask"], ["a"]),
        n("Dropout", ["a", "ratio0", "training"], ["d1", "d1_mask"], name="drop_train0"),
        n("Dropout", ["d1"], ["d2", "d2_mask"], name="drop_plain"),
        n("Relu", ["d2"], ["y"]),
    ]
    inits = [init("ix1", np.array([[1]], np.int64)), init("minus3", np.array([-3], np.int64)),
             init("ix2", np.array([[2]], np.int64)), init("eight", np.array([8], np.int64)),
             init("mask_shape", np.array([3, 8], np.int64)),
             init("rows_ix", np.array([[0], [2]], np.int64)), init("rows", rows),
             init("ratio0", np.array(0.0, np.float32)), init("training", np.array(True))]
    graph = helper.make_graph(
        nodes, "scatter_dropout",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 8])], inits)
    save("scatter_dropout", graph, opset=16)
    mask = np.zeros((3, 8), np.float32)
    mask[0], mask[2] = rows[0], rows[1]
    y = np.maximum(x.reshape(2, 3, 8) + mask, 0)
    save_tensor("scatter_dropout.input_0.pb", x, "x")
    save_tensor("scatter_dropout.output_0.pb", y, "y")


def bad_dropouts():
    f = TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    # The mask of a Dropout feeds a Cast that is a graph output.
    save("bad_dropout_mask", helper.make_graph(
        [helper.make_node("Dropout", ["x"], ["y", "m"], name="drop"),
         helper.make_node("Cast", ["m"], ["mf"], name="cast", to=f)], "g",
        [vi("x", f, [2])], [vi("y", f, [2]), vi("mf", f, [2])]), opset=13)
    # Dropout in training mode at ratio 0.5: random, not inference.
    save("bad_dropout_training", helper.make_graph(
        [helper.make_node("Dropout", ["x", "ratio", "training"], ["y"], name="drop")], "g",
        [vi("x", f, [2])], [vi("y", f, [2])],
        [init("ratio", np.array(0.5, np.float32)), init("training", np.array(True))]), opset=13)
    # ScatterND whose index is outside the data.
    save("bad_scatter_index", helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("ScatterND", ["s", "ix", "one"], ["t"], name="scatter"),
         helper.make_node("Reshape", ["x", "t"], ["y"])], "g",
        [vi("x", f, [2, 3])], [vi("y", f, [3, 2])],
        [init("ix", np.array([[2]], np.int64)), init("one", np.array([1], np.int64))]),
        check=False)


def external_tensor(name, array, location, offset):
    """A TensorProto whose bytes are at offset in the file location (ONNX
    external data); the caller writes them there."""
    t = numpy_helper.from_array(np.asarray(array), name)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)),
                       ("length", str(np.asarray(array).nbytes))):
        e = t.external_data.add()
        e.key, e.value = key, value
    return t


def external_data():
    """Weights beside the model, as exporters write models over 2 GiB: two in
    one file (the second 64 bytes past the first's end) and one in a file in
    a subdirectory. Also the bad ones, each with one entry wrong."""
    x, w1, w2, b = rand(2, 16), rand(16, 32), rand(32, 8), rand(8)
    gap = 64
    with open(os.path.join(HERE, "external_data.weights"), "wb") as f:
        f.write(w1.tobytes() + bytes(gap) + w2.tobytes())
    os.makedirs(os.path.join(HERE, "external_data"), exist_ok=True)
    with open(os.path.join(HERE, "external_data", "bias.bin"), "wb") as f:
        f.write(b.tobytes())
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w1"], ["h"]), n("Relu", ["h"], ["r"]),
             n("MatMul", ["r", "w2"], ["m"]), n("Add", ["m", "b"], ["y"])]
    vi = helper.make_tensor_value_info
    io = ([vi("x", TensorProto.FLOAT, [2, 16])], [vi("y", TensorProto.FLOAT, [2, 8])])

    def model(name, w1_entry=None):
        first = external_tensor("w1", w1, "external_data.weights", 0)
        if w1_entry:
            for e in first.external_data:
                if e.key == w1_entry[0]:
                    e.value = w1_entry[1]
        inits = [first, external_tensor("w2", w2, "external_data.weights", w1.nbytes + gap),
                 external_tensor("b", b, "external_data/bias.bin", 0)]
        save(name, helper.make_graph(nodes, "external_data", *io, inits), check=False)

    model("external_data")
    onnx.checker.check_model(os.path.join(HERE, "external_data.onnx"), full_check=True)
    y = np.maximum(x.astype(np.float64) @ w1, 0) @ w2 + b
    save_tensor("external_data.input_0.pb", x, "x")
    save_tensor("external_data.output_0.pb", y.astype(np.float32), "y")
    model("bad_external_escape", ("location", "../onnx/external_data.weights"))
    model("bad_external_absolute", ("location", "/nonexistent/external_data.weights"))
    model("bad_external_missing", ("location", "no_such_file.weights"))
    model("bad_external_range", ("offset", "1000000"))
    model("bad_external_length", ("length", "100"))
    model("bad_external_offset", ("offset", "-8"))


def symbolic_dims():
    """Inputs with named symbolic dimensions ("batch", "seq") and an operator
    Teq does not know (CumSum) whose output shape is declared with the same
    names: naming their extents at import also makes that shape known, which
    the Transpose after it needs."""
    n = helper.make_node
    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [n("MatMul", ["x", "w"], ["h"]), n("CumSum", ["h", "axis"], ["c"], name="cumsum"),
         n("Transpose", ["c"], ["y"], perm=[0, 2, 1])], "symbolic_dims",
        [vi("x", f, ["batch", "seq", 8])], [vi("y", f, ["batch", 4, "seq"])],
        [init("w", rand(8, 4)), init("axis", np.array(1, np.int64))],
        value_info=[vi("c", f, ["batch", "seq", 4])])
    save("symbolic_dims", graph)


def gelu_models():
    """GELU written out in erf as PyTorch exports it (x / sqrt 2, Erf, + 1, times
    x, then times 1/2), as BERT writes it (x * 1/2 first, times
    1 + erf(x * 1/sqrt 2)) and in tanh as PyTorch writes its approximation,
    all fused at import, beside one with + 2 that is no GELU and must stay
    as written; and ONNX's own Gelu (opset 20) in both
    of its forms. References from math.erf and math.tanh in double."""
    import math
    n = helper.make_node
    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT
    x, w = rand(3, 16), rand(16, 16)
    s = np.float32(math.sqrt(2))
    nodes = [n("MatMul", ["x", "w"], ["h"]),
             n("Div", ["h", "sqrt2"], ["a1"]), n("Erf", ["a1"], ["a2"]), n("Add", ["a2", "one"], ["a3"]),
             n("Mul", ["h", "a3"], ["a4"]), n("Mul", ["a4", "half"], ["g1"]),
             n("Mul", ["g1", "half"], ["b0"]), n("Mul", ["g1", "rsqrt2"], ["b1"]),
             n("Erf", ["b1"], ["b2"]), n("Add", ["one", "b2"], ["b3"]), n("Mul", ["b0", "b3"], ["g2"]),
             n("Mul", ["g2", "g2"], ["t1"]), n("Mul", ["g2", "t1"], ["t2"]),
             n("Mul", ["cubic", "t2"], ["t3"]), n("Add", ["g2", "t3"], ["t4"]),
             n("Mul", ["tscale", "t4"], ["t5"]), n("Tanh", ["t5"], ["t6"]), n("Add", ["one", "t6"], ["t7"]),
             n("Mul", ["g2", "t7"], ["t8"]), n("Mul", ["half", "t8"], ["g3"]),
             n("Div", ["g3", "sqrt2"], ["c1"]), n("Erf", ["c1"], ["c2"]), n("Add", ["c2", "two"], ["c3"]),
             n("Mul", ["g3", "c3"], ["c4"]), n("Mul", ["c4", "half"], ["y"])]
    inits = [init("w", w), init("sqrt2", np.array(s)), init("rsqrt2", np.array(1 / s, np.float32)),
             init("one", np.array(1, np.float32)), init("two", np.array(2, np.float32)),
             init("half", np.array(0.5, np.float32)), init("cubic", np.array(0.044715, np.float32)),
             init("tscale", np.array(math.sqrt(2 / math.pi), np.float32))]
    save("gelu_written", helper.make_graph(nodes, "gelu_written", [vi("x", f, [3, 16])],
                                           [vi("y", f, [3, 16])], inits))
    erf = np.vectorize(math.erf)
    gelu = lambda v: 0.5 * v * (1 + erf(v / math.sqrt(2)))
    gelu_tanh = lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
    g3 = gelu_tanh(gelu(gelu(x.astype(np.float64) @ w)))
    y = 0.5 * g3 * (1 + erf(g3 / math.sqrt(2)) + 1)
    save_tensor("gelu_written.input_0.pb", x, "x")
    save_tensor("gelu_written.output_0.pb", y.astype(np.float32), "y")

    # (x2 / 2) (1 + erf(x / sqrt 2)) with x2 not x: a look-alike the fusion must leave alone
    nodes = [n("Mul", ["x", "two"], ["x2"]), n("Div", ["x", "sqrt2"], ["a"]), n("Erf", ["a"], ["b"]),
             n("Add", ["b", "one"], ["e"]), n("Mul", ["x2", "half"], ["h"]), n("Mul", ["h", "e"], ["y"])]
    save("gelu_lookalike", helper.make_graph(nodes, "gelu_lookalike", [vi("x", f, [3, 16])],
                                             [vi("y", f, [3, 16])], inits))
    xd = x.astype(np.float64)
    save_tensor("gelu_lookalike.input_0.pb", x, "x")
    save_tensor("gelu_lookalike.output_0.pb",
                (xd * (1 + erf(xd / math.sqrt(2)))).astype(np.float32), "y")

    nodes = [n("Gelu", ["x"], ["e"]), n("Gelu", ["e"], ["y"], approximate="tanh")]
    m = helper.make_model(helper.make_graph(nodes, "gelu_native", [vi("x", f, [3, 16])],
                                            [vi("y", f, [3, 16])]),
                          producer_name="teq-tests", opset_imports=[helper.make_opsetid("", 20)])
    m.ir_version = 9
    onnx.save(m, os.path.join(HERE, "gelu_native.onnx"))  # this onnx's checker knows no Gelu
    e = gelu(x.astype(np.float64))
    y = 0.5 * e * (1 + np.tanh(math.sqrt(2 / math.pi) * (e + 0.044715 * e ** 3)))
    save_tensor("gelu_native.input_0.pb", x, "x")
    save_tensor("gelu_native.output_0.pb", y.astype(np.float32), "y")


def swish_models():
    """x * sigmoid(x) in both operand orders and x * hard_sigmoid(x) with
    alpha 1/6 and beta 1/2 (PyTorch's SiLU and Hardswish below opset 14),
    fused at import; beside them a hard_sigmoid of the default alpha, a
    sigmoid read twice and a sigmoid gating another tensor, which must stay
    as written. Reference in double."""
    n = helper.make_node
    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT
    x, w = rand(3, 16) * 4, rand(16, 16)
    nodes = [n("MatMul", ["x", "w"], ["h"]),
             n("Sigmoid", ["h"], ["a"]), n("Mul", ["h", "a"], ["s1"]),
             n("Sigmoid", ["s1"], ["b"]), n("Mul", ["b", "s1"], ["s2"]),
             n("HardSigmoid", ["s2"], ["c"], alpha=1 / 6), n("Mul", ["s2", "c"], ["s3"]),
             n("HardSigmoid", ["s3"], ["e"]), n("Mul", ["s3", "e"], ["s4"]),
             n("Sigmoid", ["s4"], ["g"]), n("Mul", ["s4", "g"], ["s5"]), n("Add", ["s5", "g"], ["t"]),
             n("Sigmoid", ["h"], ["k"]), n("Mul", ["t", "k"], ["y"])]
    save("swishes", helper.make_graph(nodes, "swishes", [vi("x", f, [3, 16])],
                                      [vi("y", f, [3, 16])], [init("w", w)]))
    sig = lambda v: 1 / (1 + np.exp(-v))
    hsig = lambda v, alpha: np.clip(alpha * v + 0.5, 0, 1)
    h = x.astype(np.float64) @ w
    s2 = h * sig(h)
    s2 = s2 * sig(s2)
    s3 = s2 * hsig(s2, np.float32(1 / 6))
    s4 = s3 * hsig(s3, np.float32(0.2))
    t = s4 * sig(s4) + sig(s4)
    save_tensor("swishes.input_0.pb", x, "x")
    save_tensor("swishes.output_0.pb", (t * sig(h)).astype(np.float32), "y")


def bn_relu():
    """DenseNet's pre-activation: Concat -> BatchNormalization -> Relu, a
    BatchNorm no conv takes, whose relu fuses into it; beside it a second
    BatchNorm whose output is also a graph output, whose relu must stay.
    Reference in double."""
    n = helper.make_node
    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT
    x, z = rand(1, 3, 5, 5), rand(1, 2, 5, 5)
    gamma, beta, mean = rand(5) + 1.5, rand(5), rand(5)
    var = np.abs(rand(5)) + 0.5
    nodes = [n("Concat", ["x", "z"], ["c"], axis=1),
             n("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["bn"]),
             n("Relu", ["bn"], ["r"]),
             n("BatchNormalization", ["r", "gamma", "beta", "mean", "var"], ["y2"]),
             n("Relu", ["y2"], ["y"])]
    inits = [init("z", z), init("gamma", gamma), init("beta", beta), init("mean", mean),
             init("var", var)]
    save("bn_relu", helper.make_graph(nodes, "bn_relu", [vi("x", f, [1, 3, 5, 5])],
                                      [vi("y", f, [1, 5, 5, 5]), vi("y2", f, [1, 5, 5, 5])],
                                      inits))
    bn = lambda v: ((v - mean.reshape(1, 5, 1, 1)) / np.sqrt(var.reshape(1, 5, 1, 1) + 1e-5)
                    * gamma.reshape(1, 5, 1, 1) + beta.reshape(1, 5, 1, 1))
    y2 = bn(np.maximum(bn(np.concatenate([x, z], 1).astype(np.float64)), 0))
    save_tensor("bn_relu.input_0.pb", x, "x")
    save_tensor("bn_relu.output_0.pb", np.maximum(y2, 0).astype(np.float32), "y")


def layer_norm_rank_raised():
    """The nine operators of layer_norm_written, but with an epsilon of shape
    [1, 1, 1, 1]: valid ONNX, and its broadcast raises the normalization's
    rank to 4 ([1, 2, 3, 8]), which a ReduceSum over axis 0 then takes away.
    One layer_norm of x's rank would compute another shape, so it is not
    fused."""
    gamma, beta = rand(8), rand(8)
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1], keepdims=1),
        helper.make_node("Sub", ["x", "mean"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["d2"]),
        helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["d", "sd"], ["n"]),
        helper.make_node("Mul", ["n", "gamma"], ["s"]),
        helper.make_node("Add", ["s", "beta"], ["ln"]),
        helper.make_node("ReduceSum", ["ln", "axis0"], ["y"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "layer_norm_rank_raised",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 8])],
        [init("two", np.float32(2.0)), init("eps", np.full((1, 1, 1, 1), 1e-5, np.float32)),
         init("gamma", gamma), init("beta", beta), init("axis0", np.array([0], np.int64))])
    save("layer_norm_rank_raised", graph)
    x = rand(2, 3, 8)
    xd = x.astype(np.float64)
    mean = xd.mean(axis=-1, keepdims=True)
    var = ((xd - mean) ** 2).mean(axis=-1, keepdims=True)
    ln = (xd - mean) / np.sqrt(var + np.full((1, 1, 1, 1), 1e-5)) * gamma + beta
    save_tensor("layer_norm_rank_raised.input_0.pb", x, "x")
    save_tensor("layer_norm_rank_raised.output_0.pb", ln.sum(axis=0).astype(np.float32), "y")


def maxpool_storage_order():
    """Two MaxPools with storage_order=1, which orders only the Indices
    output: the first names that output and nothing reads it, the second
    has none. Both compute the plain maximum."""
    n = helper.make_node
    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT
    nodes = [n("MaxPool", ["x"], ["p", "unread_indices"], kernel_shape=[2, 2], storage_order=1),
             n("MaxPool", ["p"], ["y"], kernel_shape=[2, 2], strides=[1, 2], storage_order=1)]
    save("maxpool_storage_order", helper.make_graph(
        nodes, "maxpool_storage_order", [vi("x", f, [1, 2, 5, 6])], [vi("y", f, [1, 2, 3, 2])]))
    x = rand(1, 2, 5, 6)
    win = lambda a, i, j: a[:, :, i:i + 2, j:j + 2].max(axis=(2, 3))
    p = np.stack([np.stack([win(x, i, j) for j in range(5)], -1) for i in range(4)], -2)
    y = np.stack([np.stack([win(p, i, j) for j in range(0, 4, 2)], -1) for i in range(3)], -2)
    save_tensor("maxpool_storage_order.input_0.pb", x, "x")
    save_tensor("maxpool_storage_order.output_0.pb", y, "y")


def reduce_noop_models():
    """Reductions with noop_with_empty_axes=1 and no axes reduce over none:
    each output element is the reduction of one input element, the element
    itself for a sum, mean or maximum, its magnitude for an L2 norm (as
    ONNX Runtime computes it). At opset 13 (ReduceSum, the axes input
    absent and given empty) and at opset 18, where every reduction takes
    its axes as an input (ReduceMean, ReduceMax, ReduceL2). Beside them a
    ReduceSum over axis 1 and one over every axis with the flag unset, so
    that a reduction which does reduce is still seen to."""
    n = helper.make_node
    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT
    x = rand(2, 3, 4)
    none = init("no_axes", np.zeros(0, np.int64))
    axis1 = init("axis1", np.array([1], np.int64))
    nodes = [n("ReduceSum", ["x"], ["a"], noop_with_empty_axes=1),
             n("ReduceSum", ["a", "no_axes"], ["b"], noop_with_empty_axes=1, keepdims=0),
             n("ReduceSum", ["b", "axis1"], ["s"], keepdims=1),
             n("ReduceSum", ["b"], ["t"], keepdims=1),
             n("Add", ["b", "s"], ["u"]), n("Add", ["u", "t"], ["y"])]
    save("reduce_noop", helper.make_graph(nodes, "reduce_noop", [vi("x", f, [2, 3, 4])],
                                          [vi("y", f, [2, 3, 4])], [none, axis1]))
    xd = x.astype(np.float64)
    save_tensor("reduce_noop.input_0.pb", x, "x")
    save_tensor("reduce_noop.output_0.pb",
                (xd + xd.sum(axis=1, keepdims=True) + xd.sum()).astype(np.float32), "y")
    nodes = [n("ReduceMean", ["x"], ["a"], noop_with_empty_axes=1),
             n("ReduceMax", ["a", "no_axes"], ["b"], noop_with_empty_axes=1),
             n("ReduceL2", ["b"], ["c"], noop_with_empty_axes=1, keepdims=0),
             n("ReduceMean", ["c", "axis1"], ["m"]), n("Sub", ["c", "m"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "reduce_noop_opset18",
                                            [vi("x", f, [2, 3, 4])], [vi("y", f, [2, 3, 4])],
                                            [none, axis1]),
                          producer_name="teq-tests", opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    onnx.save(m, os.path.join(HERE, "reduce_noop_opset18.onnx"))  # this onnx's checker stops at 17
    save_tensor("reduce_noop_opset18.input_0.pb", x, "x")
    c = np.abs(xd)
    save_tensor("reduce_noop_opset18.output_0.pb",
                (c - c.mean(axis=1, keepdims=True)).astype(np.float32), "y")


def variadic_models():
    """ONNX's variadic element-wise operators: Max of three inputs and Min
    of four, broadcasting ([2, 3, 4] with [4], [3, 1] and [1, 1, 1]), a Max
    of one input, and Sum and Mean of three (Teq's own variadic rows)."""
    n = helper.make_node
    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT
    x, b, c, e = rand(2, 3, 4), rand(4), rand(3, 1), rand(1, 1, 1)
    nodes = [n("Max", ["x", "b", "c"], ["m"]), n("Min", ["c", "m", "e", "x"], ["k"]),
             n("Max", ["k"], ["k1"]), n("Sum", ["k1", "b", "c"], ["s"]),
             n("Mean", ["s", "x", "e"], ["y"])]
    save("variadic", helper.make_graph(nodes, "variadic", [vi("x", f, [2, 3, 4])],
                                       [vi("y", f, [2, 3, 4])],
                                       [init("b", b), init("c", c), init("e", e)]))
    m = np.maximum(np.maximum(x, b), c)
    k = np.minimum(np.minimum(np.minimum(c, m), e), x)
    s = k.astype(np.float64) + b + c
    save_tensor("variadic.input_0.pb", x, "x")
    save_tensor("variadic.output_0.pb", ((s + x + e) / 3).astype(np.float32), "y")


def conv1d(x, w, b, group, stride, pad, dilation):
    n, c, length = x.shape
    m, cg, k = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), pad))
    out = (length + sum(pad) - (k - 1) * dilation - 1) // stride + 1
    y = np.zeros((n, m, out))
    mg = m // group
    for o in range(m):
        gi = o // mg
        for t in range(out):
            taps = xp[:, gi * cg:(gi + 1) * cg, t * stride:t * stride + (k - 1) * dilation + 1:dilation]
            y[:, o, t] = np.einsum("nck,ck->n", taps, w[o].astype(np.float64))
    return y + b.reshape(1, m, 1)


def windows_1d():
    """Convolutions and pools over one spatial axis ([N, C, L]): a grouped,
    strided, dilated, padded Conv with a bias, a Conv with auto_pad
    SAME_UPPER and no bias, a MaxPool, an AveragePool that does not count
    its padding, and the global pools. Teq imports each as its 2-D form over
    [N, C, 1, L]. Reference in double."""
    n = helper.make_node
    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT
    x, w1, b1, w2 = rand(1, 4, 16), rand(6, 2, 3), rand(6), rand(6, 6, 3)
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], group=2, strides=[2], pads=[1, 2],
               dilations=[2]),
             n("Relu", ["c1"], ["r"]),
             n("Conv", ["r", "w2"], ["c2"], auto_pad="SAME_UPPER"),
             n("MaxPool", ["c2"], ["p"], kernel_shape=[2], strides=[2]),
             n("AveragePool", ["p"], ["a"], kernel_shape=[3], pads=[1, 1]),
             n("GlobalMaxPool", ["a"], ["gm"]), n("GlobalAveragePool", ["c2"], ["ga"]),
             n("Mul", ["gm", "ga"], ["g"]), n("Add", ["a", "g"], ["y"])]
    save("windows_1d", helper.make_graph(nodes, "windows_1d", [vi("x", f, [1, 4, 16])],
                                         [vi("y", f, [1, 6, 4])],
                                         [init("w1", w1), init("b1", b1), init("w2", w2)]))
    c1 = conv1d(x, w1, b1, 2, 2, (1, 2), 2)                    # [1, 6, 8]
    c2 = conv1d(np.maximum(c1, 0), w2, np.zeros(6), 1, 1, (1, 1), 1)
    p = c2.reshape(1, 6, 4, 2).max(axis=3)
    pp = np.pad(p, ((0, 0), (0, 0), (1, 1)))
    counts = np.array([2, 3, 3, 2])                            # the padding is not counted
    a = np.stack([pp[:, :, t:t + 3].sum(axis=2) for t in range(4)], -1) / counts
    y = a + a.max(axis=2, keepdims=True) * c2.mean(axis=2, keepdims=True)
    save_tensor("windows_1d.input_0.pb", x, "x")
    save_tensor("windows_1d.output_0.pb", y.astype(np.float32), "y")


# Einsums of two operands, each the product between layout changes that
# Teq imports it as: (equation, x's shape, w's shape or None for x twice).
EINSUMS = [
    ("B G H I D, B G H J D -> B G H I J", (1, 2, 3, 4, 5), None),  # MaxViT's attention
    ("bij,jk->bik", (2, 3, 4), (4, 5)),
    ("...ij,...jk->...ik", (2, 3, 4, 5), (1, 3, 5, 2)),             # ellipses broadcast
    ("kj,ji", (4, 3), (3, 5)),                                      # implicit: "ik"
    ("i,i->", (6,), None),                                          # a scalar
    ("ij,jk->ki", (3, 4), (4, 5)),
    ("i,j->ij", (3,), (4,)),                                        # nothing contracted
    ("bij,bjk->bik", (2, 3, 4), (1, 4, 5)),                         # a batch broadcast
    ("ijk,kl->il", (3, 1, 4), (4, 2)),                              # j of extent 1 summed
    ("ibj,jbk->bki", (3, 2, 4), (4, 2, 5)),                         # batch moved about
    ("bij,jk->bi", (2, 3, 4), (4, 5)),                              # k summed in w first
]

# Einsums Teq keeps as they are: one operand (a diagonal), three
# operands. (equation, shapes of the operands)
EINSUMS_KEPT = [
    ("bii->bi", [(2, 3, 3)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
]


def einsum_models():
    """One model per entry of EINSUMS and EINSUMS_KEPT (einsum_K.onnx,
    einsum_kept_K.onnx); the first have references from numpy.einsum in
    double."""
    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT
    for k, (eq, xs, ws) in enumerate(EINSUMS):
        x = rand(*xs)
        w = rand(*ws) if ws else None
        y = np.einsum(eq, x.astype(np.float64), (w if ws else x).astype(np.float64))
        node = helper.make_node("Einsum", ["x", "w" if ws else "x"], ["y"], equation=eq)
        name = "einsum_%d" % k
        save(name, helper.make_graph([node], name, [vi("x", f, list(xs))],
                                     [vi("y", f, list(y.shape))],
                                     [init("w", w)] if ws else []), opset=12)
        save_tensor(name + ".input_0.pb", x, "x")
        save_tensor(name + ".output_0.pb", y.astype(np.float32), "y")
    for k, (eq, shapes) in enumerate(EINSUMS_KEPT):
        names = ["x"] + ["w%d" % i for i in range(1, len(shapes))]
        out = np.einsum(eq, *[np.zeros(s) for s in shapes]).shape
        node = helper.make_node("Einsum", names, ["y"], equation=eq)
        name = "einsum_kept_%d" % k
        save(name, helper.make_graph([node], name, [vi("x", f, list(shapes[0]))],
                                     [vi("y", f, list(out))],
                                     [init(nm, rand(*s)) for nm, s in zip(names[1:], shapes[1:])]),
             opset=12)


def conv3d(x, w, b, group, stride, pads, dilation):
    """The definition in double: pads [d0, h0, w0, d1, h1, w1]."""
    n, c, *size = x.shape
    m, cg, *k = w.shape
    xp = np.pad(x.astype(np.float64),
                ((0, 0), (0, 0)) + tuple((pads[a], pads[3 + a]) for a in range(3)))
    out = [(size[a] + pads[a] + pads[3 + a] - (k[a] - 1) * dilation[a] - 1) // stride[a] + 1
           for a in range(3)]
    y = np.zeros((n, m, *out))
    mg = m // group
    for t0 in range(k[0]):
        for t1 in range(k[1]):
            for t2 in range(k[2]):
                a0, a1, a2 = t0 * dilation[0], t1 * dilation[1], t2 * dilation[2]
                patch = xp[:, :, a0:a0 + (out[0] - 1) * stride[0] + 1:stride[0],
                           a1:a1 + (out[1] - 1) * stride[1] + 1:stride[1],
                           a2:a2 + (out[2] - 1) * stride[2] + 1:stride[2]]
                for g in range(group):
                    y[:, g * mg:(g + 1) * mg] += np.einsum(
                        "ncdhw,mc->nmdhw", patch[:, g * cg:(g + 1) * cg],
                        w[g * mg:(g + 1) * mg, :, t0, t1, t2].astype(np.float64))
    return y + (0 if b is None else b.reshape(1, m, 1, 1, 1))


def conv3d_model():
    """Two Convs over three spatial axes: a strided one with a bias and
    auto_pad SAME_UPPER, a Relu, then a grouped, dilated one with uneven
    pads and no bias. Teq imports each as conv3d. And a residual block."""
    n = helper.make_node
    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT
    x, w1, b1, w2 = rand(1, 3, 5, 9, 8), rand(4, 3, 3, 3, 3), rand(4), rand(6, 2, 2, 3, 1)
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], strides=[1, 2, 2], auto_pad="SAME_UPPER",
               kernel_shape=[3, 3, 3]),
             n("Relu", ["c1"], ["r"]),
             n("Conv", ["r", "w2"], ["y"], group=2, dilations=[2, 1, 1], pads=[1, 0, 2, 0, 1, 0])]
    # SAME_UPPER: the extra pad at the end, [1, 4, 5, 5, 4]
    c1 = conv3d(x, w1, b1, 1, (1, 2, 2), (1, 1, 0, 1, 1, 1), (1, 1, 1))
    y = conv3d(np.maximum(c1, 0), w2, None, 2, (1, 1, 1), (1, 0, 2, 0, 1, 0), (2, 1, 1))
    save("conv3d", helper.make_graph(nodes, "conv3d", [vi("x", f, [1, 3, 5, 9, 8])],
                                     [vi("y", f, list(y.shape))],
                                     [init("w1", w1), init("b1", b1), init("w2", w2)]))
    save_tensor("conv3d.input_0.pb", x, "x")
    save_tensor("conv3d.output_0.pb", y.astype(np.float32), "y")
    # R3D-18's basic block: Relu(Conv(x) + x), one conv3d once imported.
    x, w, b = rand(1, 4, 3, 6, 5), rand(4, 4, 3, 3, 3), rand(4)
    nodes = [n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1, 1, 1]),
             n("Add", ["c", "x"], ["s"]), n("Relu", ["s"], ["y"])]
    y = np.maximum(conv3d(x, w, b, 1, (1, 1, 1), (1, 1, 1, 1, 1, 1), (1, 1, 1)) + x, 0)
    save("conv3d_residual", helper.make_graph(nodes, "conv3d_residual",
                                              [vi("x", f, [1, 4, 3, 6, 5])],
                                              [vi("y", f, [1, 4, 3, 6, 5])],
                                              [init("w", w), init("b", b)]))
    save_tensor("conv3d_residual.input_0.pb", x, "x")
    save_tensor("conv3d_residual.output_0.pb", y.astype(np.float32), "y")


def pool3d(x, k, s, pads, ceil_mode, is_max, include_pad=False, dl=(1, 1, 1)):
    """ONNX's 3-D MaxPool or AveragePool from the definition, in double."""
    n, c, *size = x.shape
    out = []
    for a in range(3):
        ext = (k[a] - 1) * dl[a] + 1
        span = size[a] + pads[a] + pads[3 + a] - ext
        o = (span + (s[a] - 1 if ceil_mode else 0)) // s[a] + 1
        if ceil_mode and (o - 1) * s[a] >= size[a] + pads[a]:
            o -= 1
        out.append(o)
    y = np.zeros((n, c, *out))
    for idx in np.ndindex(*out):
        taps, n_pad = [], 0
        for t in np.ndindex(*k):
            i = [idx[a] * s[a] - pads[a] + t[a] * dl[a] for a in range(3)]
            n_pad += all(i[a] < size[a] + pads[3 + a] for a in range(3))
            if all(0 <= i[a] < size[a] for a in range(3)):
                taps.append(x[:, :, i[0], i[1], i[2]].astype(np.float64))
        if is_max:
            y[(slice(None), slice(None)) + idx] = np.max(taps, axis=0)
        else:
            y[(slice(None), slice(None)) + idx] = np.sum(taps, axis=0) / (
                n_pad if include_pad else len(taps))
    return y


def pools3d_model():
    """S3D's pools: a MaxPool over three axes with ceil_mode, a Pad of no
    extent at rank 5 (PyTorch writes one before a 3-D average pool) and an
    AveragePool counting its padding. Teq imports them as maxpool3d, no
    node and avgpool3d."""
    n = helper.make_node
    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT
    x = rand(1, 2, 5, 7, 6)
    nodes = [n("MaxPool", ["x"], ["m"], kernel_shape=[2, 3, 3], strides=[2, 2, 2],
               pads=[0, 1, 1, 1, 1, 0], ceil_mode=1),
             n("Pad", ["m", "pads"], ["p"], mode="constant"),
             n("AveragePool", ["p"], ["y"], kernel_shape=[2, 2, 2], pads=[1, 0, 1, 0, 1, 1],
               count_include_pad=1)]
    m = pool3d(x, (2, 3, 3), (2, 2, 2), (0, 1, 1, 1, 1, 0), True, True)
    y = pool3d(m, (2, 2, 2), (1, 1, 1), (1, 0, 1, 0, 1, 1), False, False, include_pad=True)
    save("pools3d", helper.make_graph(nodes, "pools3d", [vi("x", f, [1, 2, 5, 7, 6])],
                                      [vi("y", f, list(y.shape))],
                                      [init("pads", np.zeros(10, np.int64))]))
    save_tensor("pools3d.input_0.pb", x, "x")
    save_tensor("pools3d.output_0.pb", y.astype(np.float32), "y")


def bad_new_forms():
    """Malformed nodes of the forms the 3-D rows, Einsum and GridSample
    read: each breaks one rule (weights of ones, no random draws)."""
    f = TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    w = np.ones((2, 3, 3, 3, 3), np.float32)
    # kernel_shape of two extents for a W of three
    save("bad_conv3d_kernel", helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", kernel_shape=[3, 3])], "g",
        [vi("x", f, [1, 3, 4, 5, 6])], [vi("y", f, None)], [init("w", w)]), check=False)
    # a label twice in the output
    save("bad_einsum_output", helper.make_graph(
        [helper.make_node("Einsum", ["x", "x"], ["y"], name="einsum", equation="ij,jk->kk")],
        "g", [vi("x", f, [2, 2])], [vi("y", f, None)]), check=False)
    # a grid of three coordinates
    save("bad_grid", helper.make_graph(
        [helper.make_node("GridSample", ["x", "g"], ["y"], name="sample")], "g",
        [vi("x", f, [1, 2, 3, 4]), vi("g", f, [1, 3, 4, 3])], [vi("y", f, None)]),
        opset=16, check=False)
    # a 3-D MaxPool whose kernel has two extents
    save("bad_pool3d_kernel", helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["y"], name="pool", kernel_shape=[2, 2])], "g",
        [vi("x", f, [1, 2, 3, 4, 5])], [vi("y", f, None)]), check=False)
    # Resize of opset 10 that shrinks, and Upsample of opset 7 (scales an attribute)
    save("bad_resize10_shrink", helper.make_graph(
        [helper.make_node("Resize", ["x", "s"], ["y"], name="resize")], "g",
        [vi("x", f, [1, 2, 4, 4])], [vi("y", f, None)], [init("s", np.float32([1, 1, 0.5, 0.5]))]),
        opset=10, check=False)
    save("bad_upsample7", helper.make_graph(
        [helper.make_node("Upsample", ["x"], ["y"], name="up", scales=[1.0, 1.0, 2.0, 2.0])], "g",
        [vi("x", f, [1, 2, 4, 4])], [vi("y", f, None)]), opset=7, check=False)


def hard_gate_models():
    """Hard swishes and hard sigmoids written out in element-wise nodes, as
    Paddle's exporter writes them: x * clip(x + 3, 0, 6) / 6 (hard_swish),
    the gate clip(3 + x, 0, 6) * (1/6) multiplied by x (hard_sigmoid, then
    hard_swish), the gate alone (hard_sigmoid); beside them look-alikes that
    must stay as written: the product of another tensor, a clip read twice,
    a division by 5. Reference in double."""
    n = helper.make_node
    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT
    x, w = rand(3, 16) * 4, rand(16, 16) * 2
    consts = [init(k, np.float32(v)) for k, v in
              (("zero", 0), ("three", 3), ("five", 5), ("six", 6), ("sixth", 1 / 6))]

    def chain(x_in, mul_by, tag, div="six"):
        return [n("Add", [x_in, "three"], ["a" + tag]), n("Clip", ["a" + tag, "zero", "six"], ["c" + tag]),
                n("Mul", [mul_by, "c" + tag], ["m" + tag]), n("Div", ["m" + tag, div], ["s" + tag])]

    nodes = [n("MatMul", ["x", "w"], ["h"])] + chain("h", "h", "1") + [
        n("Add", ["three", "s1"], ["a2"]), n("Clip", ["a2", "zero", "six"], ["c2"]),
        n("Mul", ["c2", "sixth"], ["g2"]), n("Mul", ["g2", "s1"], ["s2"]),
        n("Add", ["s2", "three"], ["a3"]), n("Clip", ["a3", "zero", "six"], ["c3"]),
        n("Div", ["c3", "six"], ["g3"]), n("Add", ["g3", "s2"], ["t"])]
    nodes += chain("t", "h", "4") + chain("s4", "s4", "5") + [n("Add", ["s5", "c5"], ["u"])]
    nodes += chain("u", "u", "6", div="five")
    save("hard_gates", helper.make_graph(nodes, "hard_gates", [vi("x", f, [3, 16])],
                                         [vi("s6", f, [3, 16])], [init("w", w)] + consts))
    relu6 = lambda v: np.clip(v, 0, 6)
    h = x.astype(np.float64) @ w
    s1 = h * relu6(h + 3) / 6
    s2 = s1 * relu6(s1 + 3) / 6
    t = relu6(s2 + 3) / 6 + s2
    s4 = h * relu6(t + 3) / 6
    c5 = relu6(s4 + 3)
    u = s4 * c5 / 6 + c5
    save_tensor("hard_gates.input_0.pb", x, "x")
    save_tensor("hard_gates.output_0.pb", (u * relu6(u + 3) / 5).astype(np.float32), "s6")


def conv_affine_models():
    """PP-LCNetV3's learnable affine blocks: a scale and a shift (one value, or
    one per channel) after a convolution without bias, folded into it, and
    after its relu, before a 1x1 convolution of two groups and stride 2,
    folded into that one, and a scale before a padded convolution, folded
    too; beside them look-alikes that must stay as written: a scale of a
    convolution read twice, a shift by a constant of the whole tensor's
    shape. Reference in double."""
    n = helper.make_node
    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT
    x = rand(1, 4, 6, 6)
    w1, w2, b2 = rand(8, 4, 3, 3) / 2, rand(6, 4, 1, 1), rand(6)
    w3, w4, b4 = rand(6, 6, 3, 3) / 2, rand(5, 6, 3, 3) / 2, rand(5)
    s1, b1, s2, bs2 = np.float32([1.5]), rand(1, 8, 1, 1), rand(8, 1, 1) + 1, np.float32(-0.25)
    s3, full, s4 = np.float32([0.75]), rand(1, 6, 3, 3), np.float32([0.5])
    inits = [init(k, v) for k, v in (("w1", w1), ("w2", w2), ("b2", b2), ("w3", w3), ("w4", w4),
                                     ("b4", b4), ("s1", s1), ("b1", b1), ("s2", s2), ("bs2", bs2),
                                     ("s3", s3), ("full", full), ("s4", s4))]
    nodes = [n("Conv", ["x", "w1"], ["h1"], pads=[1, 1, 1, 1]),
             n("Mul", ["s1", "h1"], ["a1"]), n("Add", ["a1", "b1"], ["a2"]), n("Relu", ["a2"], ["r"]),
             n("Mul", ["r", "s2"], ["a3"]), n("Add", ["bs2", "a3"], ["a4"]),
             n("Conv", ["a4", "w2", "b2"], ["h2"], group=2, strides=[2, 2]),
             n("Conv", ["h2", "w3"], ["h3"], pads=[1, 1, 1, 1]),
             n("Mul", ["h3", "s3"], ["a5"]), n("Add", ["a5", "h3"], ["a6"]),
             n("Add", ["a6", "full"], ["a7"]), n("Mul", ["a7", "s4"], ["a8"]),
             n("Conv", ["a8", "w4", "b4"], ["y"], pads=[1, 1, 1, 1])]
    save("conv_affines", helper.make_graph(nodes, "conv_affines", [vi("x", f, [1, 4, 6, 6])],
                                           [vi("y", f, [1, 5, 3, 3])], inits))
    d = lambda a: np.asarray(a, np.float64)
    r = np.maximum(d(s1) * conv2d(x, w1, np.zeros(8), 1) + d(b1), 0)
    a4 = r * d(s2) + d(bs2)
    h2 = np.concatenate([conv2d(a4[:, 4 * g:4 * g + 4], w2[3 * g:3 * g + 3], b2[3 * g:3 * g + 3], 0)
                         for g in range(2)], axis=1)[:, :, ::2, ::2]
    h3 = conv2d(h2, w3, np.zeros(6), 1)
    a8 = (h3 * d(s3) + h3 + d(full)) * d(s4)
    save_tensor("conv_affines.input_0.pb", x, "x")
    save_tensor("conv_affines.output_0.pb", conv2d(a8, w4, b4, 1).astype(np.float32), "y")


def neutral_operand_models():
    """Arithmetic with a neutral constant, as exporters write it: Paddle's
    swish x * sigmoid(x * 1.0), then 0 + t, t - 0 and t / ones (one per
    column), all dropped at import, so that the swish fuses; beside them
    look-alikes that must stay: 0 - t, a division by ones that widens the
    result to [2, 3, 16], a product by the float32 after 1. First a layer
    normalization written out with a gamma of ones and a beta of zeros (a
    freshly initialized one), which must still fuse whole. Reference in
    double."""
    n = helper.make_node
    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT
    x, w = rand(3, 16), rand(16, 16)
    after_one = np.nextafter(np.float32(1), np.float32(2))
    inits = [init("w", w), init("one", np.float32(1)), init("zero", np.float32(0)),
             init("ones16", np.ones(16, np.float32)), init("ones_wide", np.ones((2, 3, 16), np.float32)),
             init("after_one", np.float32([after_one]))]
    inits += [init("two", np.float32(2)), init("eps", np.float32(1e-5)),
              init("gamma", np.ones(16, np.float32)), init("beta", np.zeros(16, np.float32))]
    nodes = [n("ReduceMean", ["x"], ["mean"], axes=[-1]), n("Sub", ["x", "mean"], ["dev"]),
             n("Pow", ["dev", "two"], ["dev2"]), n("ReduceMean", ["dev2"], ["var"], axes=[-1]),
             n("Add", ["var", "eps"], ["ve"]), n("Sqrt", ["ve"], ["sd"]),
             n("Div", ["dev", "sd"], ["nrm"]), n("Mul", ["nrm", "gamma"], ["scaled"]),
             n("Add", ["scaled", "beta"], ["ln"]),
             n("MatMul", ["ln", "w"], ["h"]), n("Mul", ["h", "one"], ["h1"]),
             n("Sigmoid", ["h1"], ["g"]), n("Mul", ["h", "g"], ["s"]),
             n("Add", ["zero", "s"], ["a"]), n("Sub", ["a", "zero"], ["b"]),
             n("Div", ["b", "ones16"], ["c"]), n("Sub", ["zero", "c"], ["d"]),
             n("Div", ["d", "ones_wide"], ["e"]), n("Mul", ["e", "after_one"], ["y"])]
    save("neutral_operands", helper.make_graph(nodes, "neutral_operands", [vi("x", f, [3, 16])],
                                               [vi("y", f, [2, 3, 16])], inits))
    xd = x.astype(np.float64)
    dev = xd - xd.mean(axis=-1, keepdims=True)
    h = dev / np.sqrt((dev ** 2).mean(axis=-1, keepdims=True) + 1e-5) @ w
    y = np.broadcast_to(-(h / (1 + np.exp(-h))), (2, 3, 16)) * np.float64(after_one)
    save_tensor("neutral_operands.input_0.pb", x, "x")
    save_tensor("neutral_operands.output_0.pb", y.astype(np.float32), "y")


def affines_before_convs_model():
    """IResNet's BatchNorm before a padded convolution, folded into it with a
    constant residual at the border (stride 2, odd extents); a shift and a
    scale after a relu, before a padded convolution of two groups, dilation
    2 and uneven padding, folded in turn; a BatchNorm before a 1x1
    convolution, folded without one. Beside them look-alikes that must stay:
    a BatchNorm before a padded convolution whose output an add of another
    tensor takes (its residual), one the graph also returns. Reference in
    double."""
    n = helper.make_node
    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT

    def bn_params(name, c):
        return [(name + "_g", rand(c) + 1.5), (name + "_b", rand(c)), (name + "_m", rand(c)),
                (name + "_v", np.abs(rand(c)) + 0.5)]

    def bn(v, name):
        g, b, m, var = (params[name + k].reshape(1, -1, 1, 1).astype(np.float64)
                        for k in ("_g", "_b", "_m", "_v"))
        return (v - m) / np.sqrt(var + 1e-5) * g + b

    def conv(v, w, b, group, stride, pads, dilation):
        return conv3d(v[:, :, None], w[:, :, None], b, group, (1,) + stride,
                      (0, pads[0], pads[1], 0, pads[2], pads[3]), (1,) + dilation)[:, :, 0]

    x = rand(1, 4, 11, 10)
    wa, wb, bb = rand(6, 4, 3, 3) / 2, rand(6, 3, 3, 3) / 2, rand(6)
    wc, wd, we = rand(6, 6, 3, 3) / 2, rand(5, 6, 1, 1) / 2, rand(5, 5, 3, 3) / 8
    t, sc = rand(1, 6, 1, 1), np.float32([0.75])
    params = dict(bn_params("bn1", 4) + bn_params("bn2", 6) + bn_params("bn3", 6) +
                  bn_params("bn4", 5) + [("wa", wa), ("wb", wb), ("bb", bb), ("wc", wc),
                                         ("wd", wd), ("we", we), ("t", t), ("sc", sc)])
    inits = [init(k, v) for k, v in params.items()]
    bn_node = lambda i, o, name: n("BatchNormalization", [i] + [name + k for k in
                                                              ("_g", "_b", "_m", "_v")], [o])
    nodes = [bn_node("x", "n1", "bn1"),
             n("Conv", ["n1", "wa"], ["ha"], pads=[1, 1, 1, 1], strides=[2, 2]),
             n("Relu", ["ha"], ["ra"]), n("Add", ["ra", "t"], ["a1"]), n("Mul", ["a1", "sc"], ["a2"]),
             n("Conv", ["a2", "wb", "bb"], ["hb"], group=2, pads=[2, 1, 0, 2], dilations=[2, 2]),
             bn_node("hb", "n2", "bn2"), n("Conv", ["n2", "wc"], ["hc"], pads=[1, 1, 1, 1]),
             n("Add", ["hc", "hb"], ["r"]), bn_node("r", "n3", "bn3"),
             n("Conv", ["n3", "wd"], ["hd"]), n("Relu", ["hd"], ["rd"]), bn_node("rd", "y2", "bn4"),
             n("Conv", ["y2", "we"], ["y"], pads=[1, 1, 1, 1])]
    save("affines_before_convs", helper.make_graph(
        nodes, "affines_before_convs", [vi("x", f, [1, 4, 11, 10])],
        [vi("y", f, [1, 5, 4, 4]), vi("y2", f, [1, 5, 4, 4])], inits))
    ha = conv(bn(x.astype(np.float64), "bn1"), wa, None, 1, (2, 2), (1, 1, 1, 1), (1, 1))
    hb = conv((np.maximum(ha, 0) + t) * np.float64(sc[0]), wb, bb, 2, (1, 1), (2, 1, 0, 2), (2, 2))
    r = conv(bn(hb, "bn2"), wc, None, 1, (1, 1), (1, 1, 1, 1), (1, 1)) + hb
    hd = conv(bn(r, "bn3"), wd, None, 1, (1, 1), (0, 0, 0, 0), (1, 1))
    y = conv(bn(np.maximum(hd, 0), "bn4"), we, None, 1, (1, 1), (1, 1, 1, 1), (1, 1))
    save_tensor("affines_before_convs.input_0.pb", x, "x")
    save_tensor("affines_before_convs.output_0.pb", y.astype(np.float32), "y")


def conv_transpose2d(x, w, b, group, stride, pads):
    """ConvTranspose's definition in double: W [C, M/group, kh, kw], pads
    [top, left, bottom, right] cropped from the full output."""
    n, c, h, wd = x.shape
    _, mg, kh, kw = w.shape
    cg = c // group
    full = np.zeros((n, mg * group, (h - 1) * stride + kh, (wd - 1) * stride + kw))
    for ci in range(c):
        o0 = (ci // cg) * mg
        for i in range(kh):
            for j in range(kw):
                full[:, o0:o0 + mg, i:i + (h - 1) * stride + 1:stride,
                     j:j + (wd - 1) * stride + 1:stride] += (
                    x[:, ci:ci + 1].astype(np.float64) * w[ci, :, i, j].reshape(1, mg, 1, 1))
    y = full[:, :, pads[0]:full.shape[2] - pads[2], pads[1]:full.shape[3] - pads[3]]
    return y + (0 if b is None else b.reshape(1, -1, 1, 1))


def conv_transpose_affines_model():
    """A text detector's head as Paddle writes it: a ConvTranspose of two
    groups without a bias, then the bias added per channel, a BatchNorm and
    a relu; a second ConvTranspose with its own bias, then a scale of one
    value. The add, the BatchNorm and the scale fold into the transposed
    convolutions; the relu stays. Reference in double."""
    n = helper.make_node
    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT
    x = rand(1, 4, 5, 6)
    w1, c1, w2, b2 = rand(4, 3, 2, 2), rand(1, 6, 1, 1), rand(6, 2, 3, 3) / 2, rand(2)
    g, beta, mean, var = rand(6) + 1.5, rand(6), rand(6), np.abs(rand(6)) + 0.5
    sc = np.float32([0.5])
    inits = [init(k, v) for k, v in (("w1", w1), ("c1", c1), ("w2", w2), ("b2", b2), ("g", g),
                                     ("beta", beta), ("mean", mean), ("var", var), ("sc", sc))]
    nodes = [n("ConvTranspose", ["x", "w1"], ["t1"], group=2, strides=[2, 2]),
             n("Add", ["t1", "c1"], ["a1"]),
             n("BatchNormalization", ["a1", "g", "beta", "mean", "var"], ["n1"]),
             n("Relu", ["n1"], ["r1"]),
             n("ConvTranspose", ["r1", "w2", "b2"], ["t2"], strides=[2, 2], pads=[1, 0, 0, 1]),
             n("Mul", ["sc", "t2"], ["y"])]
    save("conv_transpose_affines", helper.make_graph(
        nodes, "conv_transpose_affines", [vi("x", f, [1, 4, 5, 6])], [vi("y", f, [1, 2, 20, 24])],
        inits))
    a1 = conv_transpose2d(x, w1, None, 2, 2, (0, 0, 0, 0)) + c1
    bn = ((a1 - mean.reshape(1, 6, 1, 1)) / np.sqrt(var.reshape(1, 6, 1, 1) + 1e-5)
          * g.reshape(1, 6, 1, 1) + beta.reshape(1, 6, 1, 1))
    y = conv_transpose2d(np.maximum(bn, 0), w2, b2, 1, 2, (1, 0, 0, 1)) * np.float64(sc[0])
    save_tensor("conv_transpose_affines.input_0.pb", x, "x")
    save_tensor("conv_transpose_affines.output_0.pb", y.astype(np.float32), "y")


def upsample_asymmetric(x, sh, sw, linear):
    """Upsample-9 and Resize-10 as ONNX Runtime computes them, in double:
    output pixel i reads the input at i / scale; nearest takes the pixel
    below, linear mixes the two around it (clamped to the input)."""
    n, c, h, w = x.shape
    oh, ow = int(np.floor(h * sh)), int(np.floor(w * sw))

    def taps(o, s, size):
        pos = np.minimum(np.arange(o) / s, size - 1)
        lo = np.floor(pos).astype(int)
        return lo, np.minimum(lo + 1, size - 1), pos - lo

    (r0, r1, fr), (c0, c1, fc) = taps(oh, sh, h), taps(ow, sw, w)
    xd = x.astype(np.float64)
    if not linear:
        return xd[:, :, r0][:, :, :, c0]
    rows = xd[:, :, r0] * (1 - fr)[:, None] + xd[:, :, r1] * fr[:, None]
    return rows[:, :, :, c0] * (1 - fc) + rows[:, :, :, c1] * fc


def upsample_models():
    """The upsampling forms before Resize-11: Upsample of opset 9 (nearest
    by (2, 3), then linear by 2) and Resize of opset 10 (nearest by 2, then
    linear by (1.5, 2)), each read as resize. Reference in double."""
    n = helper.make_node
    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT
    x = rand(1, 2, 3, 4)
    for op, opset, s1, s2 in (("Upsample", 9, (2, 3), (2, 2)), ("Resize", 10, (2, 2), (1.5, 2))):
        name = "upsample%d" % opset
        inits = [init("s1", np.float32([1, 1, *s1])), init("s2", np.float32([1, 1, *s2]))]
        nodes = [n(op, ["x", "s1"], ["u"], mode="nearest"), n(op, ["u", "s2"], ["y"], mode="linear")]
        u = upsample_asymmetric(x, s1[0], s1[1], False)
        y = upsample_asymmetric(u, s2[0], s2[1], True)
        save(name, helper.make_graph(nodes, name, [vi("x", f, [1, 2, 3, 4])],
                                     [vi("y", f, list(y.shape))], inits), opset=opset)
        save_tensor(name + ".input_0.pb", x, "x")
        save_tensor(name + ".output_0.pb", y.astype(np.float32), "y")


if __name__ == "__main__":
    conv_bn()
    shape_fold(13)
    shape_fold(12)
    unsorted()
    opaque()
    opaque_types()
    custom_domain()
    bad_models()
    bad_robustness()
    int_extremes()
    layer_norm_written()
    scatter_dropout()
    bad_dropouts()
    external_data()
    symbolic_dims()
    gelu_models()
    swish_models()
    bn_relu()
    layer_norm_rank_raised()
    maxpool_storage_order()
    reduce_noop_models()
    variadic_models()
    windows_1d()
    einsum_models()
    conv3d_model()
    pools3d_model()
    bad_new_forms()
    hard_gate_models()
    conv_affine_models()
    neutral_operand_models()
    affines_before_convs_model()
    conv_transpose_affines_model()
    upsample_models()
