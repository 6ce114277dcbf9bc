"""ONNX import: every supported op (attribute and input forms, opsets 9-21) against onnxruntime.

Models are built in code with ``onnx.helper``. A case passes when our float32 evaluation of the
imported bundle equals onnxruntime's output on the original model within 1e-5 relative to the
output's magnitude (``|ours - ort| <= 1e-5 * (|ort| + max|ort|)``; integer outputs exactly). The
other tests pin the import contract: role-map bindings and transforms, provenance, folding,
older-exporter forms, dynamic-shape and unsupported-op errors.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

import torchlean_bridge as tlb
from importers.onnx import EMITTED_KINDS, HANDLERS
from torchlean_bridge.errors import UnsupportedError
from torchlean_bridge.ops import REGISTRY
from torchlean_bridge.roles import apply_transform

N = helper.make_node
RTOL = 1e-5
_rng = np.random.default_rng(0)


def f32(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape).astype(np.float32)


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def model(nodes, inputs, outputs, inits=(), opset=17, ir_version=8):
    """inputs: (name, shape[, elem type]); outputs: float names, or (name, elem type)."""
    ins = [helper.make_tensor_value_info(i[0], i[2] if len(i) > 2 else TP.FLOAT, i[1]) for i in inputs]
    outs = [helper.make_tensor_value_info(o[0], o[1], None) if isinstance(o, tuple)
            else helper.make_tensor_value_info(o, TP.FLOAT, None) for o in outputs]
    g = helper.make_graph(nodes, "g", ins, outs, [nh.from_array(v, k) for k, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir_version
    return m


def one(op, shape=(2, 3), opset=17, **attrs):
    return model([N(op, ["x"], ["y"], **attrs)], [("x", list(shape))], ["y"], opset=opset)


def _build_cases() -> dict[str, onnx.ModelProto]:
    c: dict[str, onnx.ModelProto] = {}
    for op in ["Relu", "Tanh", "Sigmoid", "Exp", "Abs", "Neg", "Sin", "Cos", "Erf", "Softplus", "Softsign", "Floor",
               "Ceil", "Sign", "Reciprocal", "HardSwish", "Identity"]:
        c[op] = one(op)
    c["Log"] = model([N("Abs", ["x"], ["a"]), N("Log", ["a"], ["y"])], [("x", [2, 3])], ["y"])
    c["Sqrt"] = model([N("Abs", ["x"], ["a"]), N("Sqrt", ["a"], ["y"])], [("x", [2, 3])], ["y"])
    c["LeakyRelu"] = one("LeakyRelu", alpha=0.2)
    c["LeakyRelu_default"] = one("LeakyRelu")
    c["Elu"] = one("Elu", alpha=0.7)
    c["Selu"] = one("Selu")
    c["HardSigmoid"] = one("HardSigmoid")
    c["Gelu_opset20"] = one("Gelu", opset=20)
    c["Gelu_tanh_opset20"] = one("Gelu", opset=20, approximate="tanh")
    c["Softmax_opset13"] = one("Softmax", shape=(2, 3, 4), axis=1)
    c["Softmax_opset11_flattens"] = one("Softmax", shape=(2, 3, 4), opset=11, axis=1)
    c["LogSoftmax_opset9_default"] = one("LogSoftmax", shape=(2, 3, 4), opset=9)
    c["Clip_opset9_attrs"] = one("Clip", opset=9, min=-0.5, max=0.5)
    c["Clip_opset13_inputs"] = model([N("Clip", ["x", "lo", "hi"], ["y"])], [("x", [2, 3])], ["y"],
                                     [("lo", np.array(-0.5, np.float32)), ("hi", np.array(0.3, np.float32))])
    c["Clip_opset13_max_only"] = model([N("Clip", ["x", "", "hi"], ["y"])], [("x", [2, 3])], ["y"],
                                       [("hi", np.array(0.3, np.float32))])
    for op in ["Add", "Sub", "Mul", "Div", "Max", "Min"]:
        c[f"{op}_broadcast_const"] = model([N(op, ["x", "c"], ["y"])], [("x", [2, 3, 4])], ["y"], [("c", f32(3, 1))])
        c[f"{op}_two_inputs"] = model([N(op, ["x", "z"], ["y"])], [("x", [2, 3, 4]), ("z", [4])], ["y"])
    c["Pow_scalar_exponent"] = model([N("Abs", ["x"], ["a"]), N("Pow", ["a", "e"], ["y"])], [("x", [2, 3])], ["y"],
                                     [("e", np.array(1.5, np.float32))])
    c["PRelu"] = model([N("PRelu", ["x", "s"], ["y"])], [("x", [2, 3, 4, 4])], ["y"], [("s", f32(3, 1, 1))])
    c["Sum_three"] = model([N("Sum", ["x", "z", "w"], ["y"])], [("x", [2, 3]), ("z", [3]), ("w", [2, 1])], ["y"])
    c["Mean_three"] = model([N("Mean", ["x", "z", "w"], ["y"])], [("x", [2, 3]), ("z", [3]), ("w", [2, 1])], ["y"])
    c["Max_three"] = model([N("Max", ["x", "z", "w"], ["y"])], [("x", [2, 3]), ("z", [3]), ("w", [2, 1])], ["y"])
    c["Where_Greater"] = model([N("Greater", ["x", "z"], ["c"]), N("Where", ["c", "x", "z"], ["y"])],
                               [("x", [2, 3]), ("z", [2, 3])], ["y"])
    c["IsNaN_Where"] = model([N("IsNaN", ["x"], ["c"]), N("Where", ["c", "z", "x"], ["y"])],
                             [("x", [2, 3]), ("z", [2, 3])], ["y"])
    c["Gemm_transB"] = model([N("Gemm", ["x", "W", "b"], ["y"], transB=1)], [("x", [2, 4])], ["y"],
                             [("W", f32(3, 4)), ("b", f32(3))])
    c["Gemm_row_bias"] = model([N("Gemm", ["x", "W", "b"], ["y"])], [("x", [2, 4])], ["y"],
                               [("W", f32(4, 3)), ("b", f32(1, 3))])
    c["Gemm_alpha_beta_transA"] = model([N("Gemm", ["x", "W", "b"], ["y"], alpha=0.5, beta=2.0, transA=1)],
                                        [("x", [4, 2])], ["y"], [("W", f32(4, 3)), ("b", f32(3))])
    c["Gemm_scalar_bias"] = model([N("Gemm", ["x", "W", "b"], ["y"], transB=1)], [("x", [2, 4])], ["y"],
                                  [("W", f32(3, 4)), ("b", f32(1))])
    c["Gemm_dynamic_B"] = model([N("Gemm", ["x", "z"], ["y"], transB=1)], [("x", [2, 4]), ("z", [3, 4])], ["y"])
    c["MatMul_Add_rank3"] = model([N("MatMul", ["x", "W"], ["h"]), N("Add", ["b", "h"], ["y"])], [("x", [2, 5, 4])],
                                  ["y"], [("W", f32(4, 3)), ("b", f32(3))])
    c["MatMul_batched"] = model([N("MatMul", ["x", "z"], ["y"])], [("x", [2, 5, 4]), ("z", [2, 4, 3])], ["y"])
    c["MatMul_vector"] = model([N("MatMul", ["x", "z"], ["y"])], [("x", [4]), ("z", [3, 4, 2])], ["y"])
    c["Conv_grouped_dilated_asym"] = model(
        [N("Conv", ["x", "W", "b"], ["y"], pads=[1, 0, 1, 2], strides=[2, 1], dilations=[1, 2], group=2)],
        [("x", [2, 4, 7, 8])], ["y"], [("W", f32(6, 2, 3, 3)), ("b", f32(6))])
    c["Conv1d_same_upper"] = model([N("Conv", ["x", "W"], ["y"], auto_pad="SAME_UPPER", strides=[2])],
                                   [("x", [1, 3, 10])], ["y"], [("W", f32(4, 3, 4))])
    c["Conv3d_valid"] = model([N("Conv", ["x", "W"], ["y"], auto_pad="VALID")], [("x", [1, 2, 4, 4, 4])], ["y"],
                              [("W", f32(3, 2, 2, 2, 2))])
    # ConvTranspose: explicit pads with output_padding, groups with dilation, output_shape (including
    # one past the uncropped output), auto_pad SAME_UPPER/SAME_LOWER with an odd total, 1-d and 3-d
    c["ConvTranspose_pads_output_padding"] = model(
        [N("ConvTranspose", ["x", "W", "b"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])],
        [("x", [2, 2, 4, 5])], ["y"], [("W", f32(2, 3, 3, 3)), ("b", f32(3))])
    c["ConvTranspose_grouped_dilated"] = model(
        [N("ConvTranspose", ["x", "W", "b"], ["y"], strides=[2, 1], pads=[0, 1, 1, 0], dilations=[2, 1], group=2)],
        [("x", [1, 4, 3, 5])], ["y"], [("W", f32(4, 1, 2, 3)), ("b", f32(2))])
    c["ConvTranspose_output_shape"] = model(
        [N("ConvTranspose", ["x", "W"], ["y"], strides=[2, 2], output_shape=[8, 10])],
        [("x", [1, 2, 4, 4])], ["y"], [("W", f32(2, 3, 3, 3))])
    for auto in ("SAME_UPPER", "SAME_LOWER"):
        c[f"ConvTranspose_{auto.lower()}"] = model(
            [N("ConvTranspose", ["x", "W", "b"], ["y"], strides=[2, 2], auto_pad=auto)],
            [("x", [1, 2, 4, 4])], ["y"], [("W", f32(2, 3, 4, 4)), ("b", f32(3))])
    c["ConvTranspose1d"] = model([N("ConvTranspose", ["x", "W", "b"], ["y"], strides=[3])], [("x", [1, 2, 5])], ["y"],
                                 [("W", f32(2, 2, 4)), ("b", f32(2))])
    c["ConvTranspose3d"] = model(
        [N("ConvTranspose", ["x", "W"], ["y"], strides=[2, 1, 2], pads=[1, 0, 0, 0, 1, 1])],
        [("x", [1, 2, 3, 3, 3])], ["y"], [("W", f32(2, 2, 2, 3, 2))])
    c["BatchNormalization"] = model([N("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)],
                                    [("x", [2, 3, 4, 4])], ["y"],
                                    [("s", f32(3)), ("b", f32(3)), ("m", f32(3)), ("v", np.abs(f32(3)) + 0.5)])
    c["LayerNormalization_last"] = model([N("LayerNormalization", ["x", "s", "b"], ["y"])], [("x", [2, 3, 4])],
                                         ["y"], [("s", f32(4)), ("b", f32(4))])
    c["LayerNormalization_axis1_no_bias"] = model([N("LayerNormalization", ["x", "s"], ["y"], axis=1)],
                                                  [("x", [2, 3, 4])], ["y"], [("s", f32(3, 4))])
    c["InstanceNormalization"] = model([N("InstanceNormalization", ["x", "s", "b"], ["y"])], [("x", [2, 3, 4, 5])],
                                       ["y"], [("s", f32(3)), ("b", f32(3))])
    c["LRN"] = one("LRN", shape=(2, 6, 3, 3), size=3, alpha=1e-2, beta=0.75, bias=2.0)
    c["LRN_size5"] = one("LRN", shape=(1, 7, 2, 3), size=5)
    c["MaxPool_v1"] = one("MaxPool", shape=(1, 2, 7, 7), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c["MaxPool_ceil"] = one("MaxPool", shape=(1, 2, 8, 8), kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    c["MaxPool_dilated"] = one("MaxPool", shape=(1, 2, 9, 9), kernel_shape=[2, 2], dilations=[2, 2])
    c["MaxPool_opset9"] = one("MaxPool", shape=(1, 2, 6, 6), opset=9, kernel_shape=[2, 2], strides=[2, 2])
    c["MaxPool_same_lower"] = one("MaxPool", shape=(1, 1, 5, 5), kernel_shape=[2, 2], auto_pad="SAME_LOWER")
    c["AveragePool_v1"] = one("AveragePool", shape=(1, 2, 7, 7), kernel_shape=[3, 3], strides=[2, 2])
    c["AveragePool_pad_excluded"] = one("AveragePool", shape=(1, 2, 7, 7), kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    c["AveragePool_pad_included"] = one("AveragePool", shape=(1, 2, 7, 7), kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                        count_include_pad=1)
    c["AveragePool_1d"] = one("AveragePool", shape=(2, 3, 9), kernel_shape=[2], strides=[2])
    c["GlobalAveragePool"] = one("GlobalAveragePool", shape=(2, 3, 4, 5))
    c["GlobalMaxPool"] = one("GlobalMaxPool", shape=(2, 3, 4, 5))
    c["Flatten_axis2"] = one("Flatten", shape=(2, 3, 4), axis=2)
    c["Transpose"] = one("Transpose", shape=(2, 3, 4), perm=[2, 0, 1])
    c["Transpose_default"] = one("Transpose", shape=(2, 3, 4))
    c["Reshape_zero_and_minus_one"] = model([N("Reshape", ["x", "s"], ["y"])], [("x", [2, 3, 4])], ["y"],
                                            [("s", i64(0, -1))])
    c["Squeeze_opset11_attr"] = one("Squeeze", shape=(2, 1, 4), opset=11, axes=[1])
    c["Squeeze_opset13_input"] = model([N("Squeeze", ["x", "a"], ["y"])], [("x", [2, 1, 4])], ["y"], [("a", i64(-2))])
    c["Unsqueeze_opset11_attr"] = one("Unsqueeze", shape=(2, 4), opset=11, axes=[0, 3])
    c["Unsqueeze_opset13_input"] = model([N("Unsqueeze", ["x", "a"], ["y"])], [("x", [2, 4])], ["y"], [("a", i64(-1))])
    c["Concat"] = model([N("Concat", ["x", "z", "c"], ["y"], axis=-1)], [("x", [2, 3]), ("z", [2, 2])], ["y"],
                        [("c", f32(2, 1))])
    c["Split_opset13_sizes"] = model([N("Split", ["x", "s"], ["y1", "y2"], axis=1)], [("x", [2, 5])], ["y1", "y2"],
                                     [("s", i64(2, 3))])
    c["Split_opset11_equal"] = model([N("Split", ["x"], ["y1", "y2", "y3"], axis=1)], [("x", [2, 6])],
                                     ["y1", "y2", "y3"], opset=11)
    c["Split_opset11_attr"] = model([N("Split", ["x"], ["y1", "y2"], axis=0, split=[1, 3])], [("x", [4, 2])],
                                    ["y1", "y2"], opset=11)
    c["Split_opset18_num_outputs"] = model([N("Split", ["x"], ["y1", "y2"], axis=1, num_outputs=2)],
                                           [("x", [2, 5])], ["y1", "y2"], opset=18)
    c["Slice_opset9_attrs"] = one("Slice", shape=(4, 5), opset=9, starts=[1, -3], ends=[100, -1], axes=[0, 1])
    c["Slice_opset13_steps"] = model(
        [N("Slice", ["x", "st", "en", "ax", "sp"], ["y"])], [("x", [4, 6])], ["y"],
        [("st", i64(1, 0)), ("en", i64(4, 2**63 - 1)), ("ax", i64(0, -1)), ("sp", i64(2, 3))])
    c["Gather_const_indices"] = model([N("Gather", ["x", "i"], ["y"], axis=1)], [("x", [2, 5, 3])], ["y"],
                                      [("i", np.array([[0, -1], [2, 2]], np.int64))])
    c["Gather_scalar_index"] = model([N("Gather", ["x", "i"], ["y"])], [("x", [4, 3])], ["y"],
                                     [("i", np.array(2, np.int64))])
    c["Gather_embedding_int64_ids"] = model([N("Gather", ["E", "ids"], ["y"])], [("ids", [2, 3], TP.INT64)], ["y"],
                                            [("E", f32(10, 4))])
    c["GatherND_const"] = model([N("GatherND", ["x", "i"], ["y"])], [("x", [3, 4, 2])], ["y"],
                                [("i", np.array([[0, 1], [2, -1]], np.int64))])
    c["Expand_bidirectional"] = model([N("Expand", ["x", "s"], ["y"])], [("x", [3, 1])], ["y"], [("s", i64(2, 1, 4))])
    c["Pad_opset13_inputs"] = model([N("Pad", ["x", "p", "v"], ["y"])], [("x", [2, 3])], ["y"],
                                    [("p", i64(0, 1, 1, 2)), ("v", np.array(0.5, np.float32))])
    c["Pad_opset9_attrs"] = one("Pad", opset=9, pads=[1, 0, 0, 1], value=2.0)
    c["Pad_opset9_edge"] = one("Pad", shape=(3, 4), opset=9, pads=[2, 0, 1, 3], mode="edge")
    for mode in ("reflect", "edge", "wrap"):
        c[f"Pad_opset19_{mode}"] = model([N("Pad", ["x", "p"], ["y"], mode=mode)], [("x", [3, 4])], ["y"],
                                         [("p", i64(2, 1, 1, 3))], opset=19, ir_version=9)
    c["Pad_opset18_axes"] = model([N("Pad", ["x", "p", "", "a"], ["y"])], [("x", [2, 3])], ["y"],
                                  [("p", i64(1, 2)), ("a", i64(-1))], opset=18)
    c["ReduceSum_opset11_attr"] = one("ReduceSum", shape=(2, 3, 4), opset=11, axes=[1], keepdims=0)
    c["ReduceSum_opset13_input"] = model([N("ReduceSum", ["x", "a"], ["y"])], [("x", [2, 3, 4])], ["y"],
                                         [("a", i64(0, 2))])
    c["ReduceSum_all"] = one("ReduceSum", shape=(2, 3), opset=13, keepdims=0)
    c["ReduceMean_opset13_attr"] = one("ReduceMean", shape=(2, 3, 4), opset=13, axes=[-1])
    c["ReduceMean_opset18_input"] = model([N("ReduceMean", ["x", "a"], ["y"], keepdims=0)], [("x", [2, 3, 4])], ["y"],
                                          [("a", i64(1, 2))], opset=18)
    c["ReduceMax_opset18"] = model([N("ReduceMax", ["x", "a"], ["y"], keepdims=0)], [("x", [2, 3, 4])], ["y"],
                                   [("a", i64(1))], opset=18)
    c["ReduceMin_all"] = one("ReduceMin", shape=(2, 3), opset=13, keepdims=0)
    c["ArgMax"] = model([N("ArgMax", ["x"], ["y"], axis=1)], [("x", [2, 3, 4])], [("y", TP.INT64)])
    c["Cast_roundtrip"] = model([N("Cast", ["x"], ["i"], to=TP.INT64), N("Cast", ["i"], ["y"], to=TP.FLOAT)],
                                [("x", [2, 3])], ["y"])
    c["Dropout_opset12_mask"] = model([N("Dropout", ["x"], ["y", "m"])], [("x", [2, 3])], ["y"], opset=12)
    c["Dropout_opset9_mask"] = model([N("Dropout", ["x"], ["y", "m"], ratio=0.3)], [("x", [2, 3])], ["y"], opset=9)
    c["Einsum_batched_matmul"] = model([N("Einsum", ["x", "z"], ["y"], equation="bij,bjk->bik")],
                                       [("x", [2, 3, 4]), ("z", [2, 4, 5])], ["y"])
    c["Einsum_transposed"] = model([N("Einsum", ["x", "z"], ["y"], equation="ij,kj->ki")],
                                   [("x", [3, 4]), ("z", [5, 4])], ["y"])
    c["Einsum_outer"] = model([N("Einsum", ["x", "z"], ["y"], equation="bi,bj->bij")], [("x", [2, 3]), ("z", [2, 4])],
                              ["y"])
    c["Einsum_weight_is_linear"] = model([N("Einsum", ["x", "W"], ["y"], equation="bik,dk->bid")], [("x", [2, 3, 4])],
                                         ["y"], [("W", f32(5, 4))])
    c["Einsum_sums_operand_only_letters"] = model([N("Einsum", ["x", "z"], ["y"], equation="bij,jk->ik")],
                                                  [("x", [2, 3, 4]), ("z", [4, 5])], ["y"])
    c["Tile"] = model([N("Tile", ["x", "r"], ["y"])], [("x", [2, 3])], ["y"], [("r", i64(2, 3))])
    c["Resize_nearest_scales"] = model([N("Resize", ["x", "", "sc"], ["y"], mode="nearest",
                                          coordinate_transformation_mode="asymmetric", nearest_mode="floor")],
                                        [("x", [1, 2, 3, 4])], ["y"], [("sc", np.array([1, 1, 2, 3], np.float32))])
    c["Resize_nearest_sizes_half_pixel"] = model([N("Resize", ["x", "", "", "sz"], ["y"], mode="nearest")],
                                                 [("x", [1, 2, 3, 4])], ["y"], [("sz", i64(1, 2, 9, 8))])
    c["Upsample_opset9"] = model([N("Upsample", ["x", "sc"], ["y"], mode="nearest")], [("x", [1, 1, 2, 3])], ["y"],
                                 [("sc", np.array([1, 1, 2, 2], np.float32))], opset=9)
    # linear Resize: each coordinate mode with sizes (up and down), scales equal to out/in, 1-d and 3-d,
    # the legacy forms (opset-10 Resize, opset-9 Upsample: asymmetric)
    for coord in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"):
        c[f"Resize_linear_{coord}"] = model(
            [N("Resize", ["x", "", "", "sz"], ["y"], mode="linear", coordinate_transformation_mode=coord)],
            [("x", [1, 2, 3, 5])], ["y"], [("sz", i64(1, 2, 7, 2))], opset=19, ir_version=9)
    c["Resize_linear_scales"] = model([N("Resize", ["x", "", "sc"], ["y"], mode="linear")], [("x", [1, 2, 4, 6])],
                                      ["y"], [("sc", np.array([1, 1, 2, 0.5], np.float32))])
    c["Resize_linear_1d_3d"] = model(
        [N("Resize", ["x", "", "", "s1"], ["y"], mode="linear"),
         N("Resize", ["z", "", "", "s3"], ["w"], mode="linear")],
        [("x", [2, 3, 5]), ("z", [1, 2, 3, 4, 5])], ["y", "w"], [("s1", i64(2, 3, 9)), ("s3", i64(1, 2, 6, 8, 3))])
    c["Resize_linear_opset10"] = model([N("Resize", ["x", "sc"], ["y"], mode="linear")], [("x", [1, 2, 3, 4])], ["y"],
                                       [("sc", np.array([1, 1, 2, 2], np.float32))], opset=10)
    c["Upsample_linear_opset9"] = model([N("Upsample", ["x", "sc"], ["y"], mode="linear")], [("x", [1, 2, 3, 4])],
                                        ["y"], [("sc", np.array([1, 1, 2, 3], np.float32))], opset=9)
    # composite reductions: axes as an input (opset 18), as an attribute (opset 13), all axes, noop
    for op in ("ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp"):
        c[f"{op}_axes_input"] = model([N(op, ["x", "ax"], ["y"], keepdims=0)], [("x", [2, 3, 4])], ["y"],
                                      [("ax", i64(-1, 0))], opset=18)
        c[f"{op}_opset13_all"] = model([N(op, ["x"], ["y"])], [("x", [2, 3, 4])], ["y"], opset=13)
    c["ReduceLogSum_of_exp"] = model([N("Exp", ["x"], ["e"]), N("ReduceLogSum", ["e", "ax"], ["y"])],
                                     [("x", [2, 3, 4])], ["y"], [("ax", i64(1))], opset=18)
    c["ReduceL2_noop"] = model([N("ReduceL2", ["x"], ["y"], noop_with_empty_axes=1)], [("x", [2, 3])], ["y"],
                               opset=18)
    for mode in ("DCR", "CRD"):
        c[f"DepthToSpace_{mode}"] = model([N("DepthToSpace", ["x"], ["y"], blocksize=2, mode=mode)],
                                          [("x", [2, 8, 2, 3])], ["y"])
    c["SpaceToDepth"] = model([N("SpaceToDepth", ["x"], ["y"], blocksize=2)], [("x", [1, 3, 4, 6])], ["y"])
    c["ThresholdedRelu"] = one("ThresholdedRelu", alpha=0.3, opset=10)
    c["Shrink"] = one("Shrink", lambd=0.4, bias=0.1, opset=9)
    for pos, neg in ((1, 1), (1, 0), (0, 1), (0, 0)):
        c[f"IsInf_{pos}{neg}"] = model([N("Div", ["x", "z"], ["q"]),
                                        N("IsInf", ["q"], ["b"], detect_positive=pos, detect_negative=neg),
                                        N("Cast", ["b"], ["y"], to=1)], [("x", [2, 3]), ("z", [2, 3])], ["y"], opset=20)
    for upper in (0, 1):
        c[f"Trilu_upper{upper}"] = model([N("Trilu", ["x", "k"], ["y"], upper=upper)], [("x", [2, 3, 4])], ["y"],
                                         [("k", i64(1))], opset=14)
    c["Trilu_default_k"] = model([N("Trilu", ["x"], ["y"])], [("x", [4, 3])], ["y"], opset=14)
    c["GroupNormalization_opset21"] = model([N("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2,
                                               epsilon=1e-3)], [("x", [2, 4, 3, 3])], ["y"],
                                            [("s", f32(4)), ("b", f32(4))], opset=21, ir_version=10)
    for p_ in (1, 2):
        c[f"LpNormalization_p{p_}"] = model([N("LpNormalization", ["x"], ["y"], p=p_, axis=1)], [("x", [2, 3, 4])],
                                            ["y"])
    # inverse trig and hyperbolic functions, fed inside their domains; Round (half to even)
    for op in ("Atan", "Sinh", "Cosh", "Asinh"):
        c[op] = one(op, opset=9)
    for op in ("Asin", "Acos", "Atanh"):
        c[op] = model([N("Tanh", ["x"], ["t"]), N(op, ["t"], ["y"])], [("x", [2, 3])], ["y"], opset=9)
    c["Acosh"] = model([N("Abs", ["x"], ["a"]), N("Add", ["a", "one"], ["b"]), N("Acosh", ["b"], ["y"])],
                       [("x", [2, 3])], ["y"], [("one", np.array(1.0, np.float32))], opset=9)
    c["Round"] = model([N("Mul", ["x", "k"], ["z"]), N("Round", ["z"], ["y"])], [("x", [2, 3])], ["y"],
                       [("k", np.array(4.0, np.float32))], opset=11)
    for exclusive, reverse in ((0, 0), (1, 0), (0, 1), (1, 1)):
        c[f"CumSum_{exclusive}{reverse}"] = model(
            [N("CumSum", ["x", "ax"], ["y"], exclusive=exclusive, reverse=reverse)], [("x", [2, 3, 4])], ["y"],
            [("ax", np.array(-1, np.int64))], opset=14)
    for largest in (0, 1):
        c[f"TopK_largest{largest}"] = model([N("TopK", ["x", "k"], ["y", "i"], axis=1, largest=largest)],
                                            [("x", [2, 5, 3])], ["y"], [("k", i64(3))], opset=11)
    c["GatherElements_computed"] = model(
        [N("ArgMax", ["x"], ["a"], axis=2), N("GatherElements", ["x", "a"], ["y"], axis=2)], [("x", [2, 3, 4])], ["y"])
    c["GatherElements_const_negative"] = model([N("GatherElements", ["x", "i"], ["y"], axis=0)], [("x", [3, 4])],
                                               ["y"], [("i", np.array([[0, -1, 2, 1], [-3, 0, 0, 2]], np.int64))])
    c["Einsum_one_operand"] = model([N("Einsum", ["x"], ["y"], equation="bij->jb")], [("x", [2, 3, 4])], ["y"])
    c["Shape_Gather_Concat_folded"] = model(
        [N("Shape", ["x"], ["s"]), N("Gather", ["s", "i"], ["g"], axis=0), N("Unsqueeze", ["g", "a"], ["u"]),
         N("Concat", ["u", "m1"], ["ns"], axis=0), N("Reshape", ["x", "ns"], ["y"])], [("x", [2, 3, 4])], ["y"],
        [("i", np.array(0, np.int64)), ("a", i64(0)), ("m1", i64(-1))])
    c["ConstantOfShape_folded"] = model(
        [N("ConstantOfShape", ["s"], ["c"], value=helper.make_tensor("v", TP.FLOAT, [1], [2.0])),
         N("Add", ["x", "c"], ["y"])], [("x", [2, 3])], ["y"], [("s", i64(2, 3))])
    c["Range_Cast_folded"] = model(
        [N("Range", ["a", "b", "c"], ["r"]), N("Cast", ["r"], ["rf"], to=TP.FLOAT), N("Add", ["x", "rf"], ["y"])],
        [("x", [2, 3])], ["y"], [("a", np.array(0, np.int64)), ("b", np.array(3, np.int64)),
                                 ("c", np.array(1, np.int64))])
    c["Constant_node_weights"] = model([N("Constant", [], ["W"], value=nh.from_array(f32(4, 3))),
                                        N("MatMul", ["x", "W"], ["y"])], [("x", [2, 4])], ["y"])
    c["Two_outputs"] = model([N("Relu", ["x"], ["y"]), N("Sigmoid", ["z"], ["w"])], [("x", [2, 3]), ("z", [3])],
                             ["y", "w"])
    return c


CASES = _build_cases()


def random_feeds(m: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inits = {t.name for t in m.graph.initializer}
    feeds = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.type.tensor_type.elem_type == TP.INT64:
            feeds[vi.name] = rng.integers(0, 3, shape).astype(np.int64)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def run_ort(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_close(ours, ref, rtol: float = RTOL) -> None:
    for o, r in zip(ours, ref, strict=True):
        o, r = np.asarray(o), np.asarray(r)
        assert o.shape == r.shape
        if r.dtype.kind != "f":
            assert np.array_equal(o, r)
            continue
        same = o.astype(np.float64) == r  # equal infinities count as agreeing
        assert np.array_equal(np.isnan(o), np.isnan(r)) and np.array_equal(o[np.isinf(r)], r[np.isinf(r)])
        finite = np.isfinite(r) & ~same
        floor = float(np.max(np.abs(r[np.isfinite(r)]), initial=0.0))
        err = np.abs(o[finite].astype(np.float64) - r[finite])
        assert np.all(err <= rtol * (np.abs(r[finite]) + floor) + 1e-30), f"max error {np.max(err, initial=0.0)}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_import_matches_onnxruntime(name: str) -> None:
    m = CASES[name]
    feeds = random_feeds(m)
    bundle = tlb.import_onnx(m)
    tlb.check(bundle.graph)
    ours = tlb.evaluate(bundle.graph, bundle.payload, list(feeds.values()), dtype="float32")
    assert_close(ours, run_ort(m, feeds))
    assert {n.kind for n in bundle.graph} <= EMITTED_KINDS


def test_emitted_kinds_are_registered_and_handlers_cover_the_issue_ops() -> None:
    assert EMITTED_KINDS <= set(REGISTRY)
    wanted = {"Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Pow", "Conv", "ConvTranspose", "BatchNormalization",
              "LayerNormalization", "InstanceNormalization", "MaxPool", "AveragePool", "GlobalAveragePool", "Relu",
              "LeakyRelu", "PRelu", "Elu", "Selu", "Sigmoid", "Tanh", "Softplus", "Softsign", "Erf", "Gelu", "Exp",
              "Log", "Sqrt", "Abs", "Neg", "Reciprocal", "Softmax", "LogSoftmax", "Reshape", "Flatten", "Transpose",
              "Squeeze", "Unsqueeze", "Concat", "Split", "Slice", "Gather", "Expand", "Pad", "Where", "Clip", "Cast",
              "Identity", "Dropout", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "Sum", "Max", "Min",
              "Mean", "Einsum", "LRN", "Tile", "GatherND", "Resize", "Upsample", "ReduceL1", "ReduceL2",
              "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "DepthToSpace", "SpaceToDepth",
              "ThresholdedRelu", "Shrink", "IsInf", "Trilu", "GroupNormalization", "LpNormalization", "Atan",
              "Asin", "Acos", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Round", "CumSum", "TopK",
              "GatherElements"}
    assert wanted <= set(HANDLERS)


# -- lowering forms ---------------------------------------------------------------------------

def kinds(name: str) -> dict[str, int]:
    return tlb.import_onnx(CASES[name]).graph.ops_used()


def test_linear_recognized_only_when_exact() -> None:
    assert kinds("Gemm_transB") == {"input": 1, "linear": 1}
    assert kinds("MatMul_Add_rank3") == {"input": 1, "linear": 1}
    assert "matmul" in kinds("Gemm_dynamic_B")
    # a bias that is not a per-output vector stays an explicit broadcast add
    assert kinds("Gemm_scalar_bias") == {"input": 1, "linear": 1, "const": 1, "broadcast_to": 1, "add": 1}


def test_matmul_output_used_twice_is_not_fused() -> None:
    m = model([N("MatMul", ["x", "W"], ["h"]), N("Add", ["h", "b"], ["y"]), N("Relu", ["h"], ["r"])],
              [("x", [2, 4])], ["y", "r"], [("W", f32(4, 3)), ("b", f32(3))])
    b = tlb.import_onnx(m)
    assert b.graph.ops_used()["add"] == 1
    assert not np.any(b.payload.get(b.roles["W"].node, "bias"))
    feeds = random_feeds(m)
    assert_close(tlb.evaluate(b.graph, b.payload, list(feeds.values()), dtype="float32"), run_ort(m, feeds))


def test_contraction_with_a_weight_is_a_bound_linear() -> None:
    b = tlb.import_onnx(CASES["Einsum_weight_is_linear"])
    assert b.graph.ops_used() == {"input": 1, "linear": 1, "reshape": 2}
    assert b.roles["W"].role == "weight" and b.roles["W"].transform is None


def test_pools_are_v1_only_when_exactly_representable() -> None:
    assert kinds("MaxPool_v1") == {"input": 1, "max_pool": 1}
    assert kinds("AveragePool_pad_included") == {"input": 1, "avg_pool": 1}
    assert kinds("MaxPool_ceil") == {"input": 1, "max_pool_nd": 1}
    assert kinds("MaxPool_dilated") == {"input": 1, "max_pool_nd": 1}
    assert kinds("AveragePool_pad_excluded") == {"input": 1, "avg_pool_nd": 1}


def test_softmax_before_opset13_flattens_at_axis() -> None:
    g = tlb.import_onnx(CASES["Softmax_opset11_flattens"]).graph
    assert [n.kind for n in g] == ["input", "reshape", "softmax", "reshape"]
    assert g.nodes[1].out_shape == (2, 12) and g.nodes[2].attrs["axis"] == 1
    g13 = tlb.import_onnx(CASES["Softmax_opset13"]).graph
    assert [n.kind for n in g13] == ["input", "softmax"] and g13.nodes[1].attrs["axis"] == 1


def test_conv_is_v1_conv_with_grouped_weight_and_channel_axis_1() -> None:
    b = tlb.import_onnx(CASES["Conv_grouped_dilated_asym"])
    conv = next(n for n in b.graph if n.kind == "conv")
    assert conv.attrs["channel_axis"] == 1 and conv.attrs["groups"] == 2
    assert conv.attrs["padding"] == (1, 0) and conv.attrs["padding_after"] == (1, 2)
    assert b.payload.get(conv.id, "weight").shape == (6, 2, 3, 3)


# -- role map, provenance, folding --------------------------------------------------------------

def _initializer_values(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: nh.to_array(t) for t in m.graph.initializer}


@pytest.mark.parametrize("name", ["Gemm_transB", "Gemm_row_bias", "MatMul_Add_rank3", "Conv_grouped_dilated_asym",
                                  "BatchNormalization", "LayerNormalization_last", "LayerNormalization_axis1_no_bias",
                                  "InstanceNormalization", "Concat", "PRelu", "Gather_embedding_int64_ids"])
def test_every_initializer_is_bound_and_its_transform_reproduces_the_payload(name: str) -> None:
    m = CASES[name]
    b = tlb.import_onnx(m)
    values = _initializer_values(m)
    assert set(values) == set(b.roles)
    for binding in b.roles.bindings():
        payload = b.payload.get(binding.node, binding.role)
        assert np.array_equal(apply_transform(binding.transform, values[binding.key]), payload)


def test_gemm_and_matmul_weights_record_their_layout() -> None:
    assert tlb.import_onnx(CASES["Gemm_transB"]).roles["W"].transform is None
    assert tlb.import_onnx(CASES["Gemm_row_bias"]).roles["W"].transform == "transpose"
    assert tlb.import_onnx(CASES["Gemm_row_bias"]).roles["b"].transform == "reshape:3"
    assert tlb.import_onnx(CASES["MatMul_Add_rank3"]).roles["W"].transform == "transpose"


def test_weight_reached_through_transpose_keeps_its_binding() -> None:
    """Older exporters: Transpose(W) feeding MatMul; the fold keeps W bound (two transposes cancel)."""
    m = model([N("Transpose", ["W"], ["Wt"]), N("MatMul", ["x", "Wt"], ["y"])], [("x", [2, 4])], ["y"],
              [("W", f32(3, 4))])
    b = tlb.import_onnx(m)
    assert b.roles["W"].transform is None and b.roles["W"].role == "weight"


def test_sources_name_the_onnx_node_and_the_tensor_of_the_last_ir_node() -> None:
    m = model([N("Softmax", ["x"], ["y"], name="sm", axis=1), N("Relu", ["y"], ["z"], name="act")],
              [("x", [2, 3, 4])], ["z"], opset=11)
    g = tlb.import_onnx(m).graph
    assert [(n.kind, n.source.name, n.source.target, n.source.tensor) for n in g][1:] == [
        ("reshape", "sm", "Softmax", None), ("softmax", "sm", "Softmax", None), ("reshape", "sm", "Softmax", "y"),
        ("relu", "act", "Relu", "z")]
    assert g.nodes[0].source.tensor == "x" and g.nodes[0].source.framework == "onnx"


def test_shape_subgraphs_fold_into_the_payload() -> None:
    b = tlb.import_onnx(CASES["Shape_Gather_Concat_folded"])
    assert b.graph.ops_used() == {"input": 1, "reshape": 1}
    b = tlb.import_onnx(CASES["ConstantOfShape_folded"])
    const = next(n for n in b.graph if n.kind == "const")
    assert const.source.folded and np.array_equal(b.payload.get(const.id, "values"), np.full((2, 3), 2.0))
    assert b.report["static_initializers"] == ["s"]


# -- older exporters --------------------------------------------------------------------------

def test_initializers_listed_as_graph_inputs_are_not_model_inputs() -> None:
    W = f32(3, 4)
    m = model([N("MatMul", ["x", "W"], ["y"])], [("x", [2, 4]), ("W", [4, 3])], ["y"], [("W", W.T.copy())],
              opset=9, ir_version=3)
    b = tlb.import_onnx(m)
    assert len(b.graph.inputs) == 1 and b.roles["W"].node == 1
    x = np.ones((2, 4), np.float32)
    assert_close(tlb.evaluate(b.graph, b.payload, [x], dtype="float32"), [x @ W.T])


def test_dropout_mask_output_is_all_true_in_inference() -> None:
    m = model([N("Dropout", ["x"], ["y", "m"]), N("Cast", ["m"], ["mf"], to=TP.FLOAT), N("Mul", ["y", "mf"], ["z"])],
              [("x", [2, 3])], ["z"], opset=9)
    b = tlb.import_onnx(m)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(tlb.evaluate(b.graph, b.payload, [x], dtype="float32")[0], x)


def test_constant_node_weights_are_bound_as_parameters() -> None:
    b = tlb.import_onnx(CASES["Constant_node_weights"])
    assert b.roles["W"].role == "weight" and b.roles["W"].transform == "transpose"


# -- errors -----------------------------------------------------------------------------------

def test_dynamic_batch_dimension_is_one_with_a_note_and_others_need_input_shapes() -> None:
    m = model([N("Add", ["x", "z"], ["y"])], [("x", ["batch", 4]), ("z", [1, "batch", 4])], ["y"])
    b = tlb.import_onnx(m)
    assert [b.graph.nodes[i].out_shape for i in b.graph.inputs] == [(1, 4), (1, 1, 4)]
    assert any("`batch` at axis 0 (batch) set to 1" in n for n in b.report["notes"])
    m = model([N("Relu", ["x"], ["y"])], [("x", ["batch", "width"])], ["y"])
    with pytest.raises(tlb.BridgeError, match=r"dynamic dimensions other than the batch axis: `x` axis 1 \(`width`\)"):
        tlb.import_onnx(m)
    assert tlb.import_onnx(m, input_shapes={"x": (3, 4)}).graph.nodes[0].out_shape == (3, 4)
    assert tlb.import_onnx(m, input_shapes=[(5, 4)]).graph.nodes[1].out_shape == (5, 4)


def test_unsupported_ops_are_all_listed_at_once_with_names_and_opset() -> None:
    m = model([N("Mod", ["x", "x"], ["v"], name="top", fmod=0), N("Relu", ["v"], ["r"]),
               N("Unique", ["x"], ["h"], name="hm"), N("Pad", ["x", "p"], ["y"], name="pad", mode="reflect")],
              [("x", [2, 3])], ["r", "h", "y"], [("k", i64(1)), ("p", i64(0, -1, 0, 1))], opset=13)
    with pytest.raises(UnsupportedError) as e:
        tlb.import_onnx(m)
    msg = str(e.value)
    assert "3 node(s)" in msg and "node `top`, opset 13" in msg and "node `hm`, opset 13" in msg
    assert "node `pad`, opset 13): negative pads (before [0, -1], after [0, 1]) with mode=reflect" in msg
    assert [it["name"] for it in e.value.items] == ["top", "hm", "pad"]


def test_malformed_nodes_are_invalid_models_and_undefined_tensors_are_reported() -> None:
    m = model([N("MaxPool", ["x"], ["y"], name="no_kernel")], [("x", [1, 2, 5, 5])], ["y"])
    with pytest.raises(tlb.BridgeError, match=r"node 0 \(`no_kernel`, MaxPool\): MaxPool-12 requires attribute"
                                              r"\(s\) kernel_shape"):
        tlb.import_onnx(m)
    m = model([N("Conv", ["x", "W"], ["z"], name="no_weight")], [("x", [1, 2, 5, 5])], ["z"])
    with pytest.raises(UnsupportedError) as e:
        tlb.import_onnx(m)
    assert {it["name"]: it["reason"] for it in e.value.items} == {"no_weight": "reads undefined tensors ['W']"}


def test_custom_domain_and_bad_files_are_bridge_errors(tmp_path) -> None:
    m = model([N("Foo", ["x"], ["y"], domain="com.example")], [("x", [2])], ["y"])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedError, match="custom domain `com.example`"):
        tlb.import_onnx(m)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(tlb.BridgeError, match="ONNX import"):
        tlb.import_onnx(bad)
    with pytest.raises(tlb.BridgeError, match="no such file"):
        tlb.import_onnx(tmp_path / "missing.onnx")
    with pytest.raises(tlb.BridgeError, match="default-domain opset version 1099511627776"):
        tlb.import_onnx(one("Relu", opset=2**40))


def test_import_from_path_and_bytes(tmp_path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(CASES["Gemm_transB"], str(path))
    assert tlb.import_onnx(path) == tlb.import_onnx(path.read_bytes()) == tlb.import_onnx(CASES["Gemm_transB"])


@pytest.mark.parametrize("coord", ["half_pixel", "pytorch_half_pixel", "half_pixel_symmetric", "asymmetric",
                                   "align_corners"])
@pytest.mark.parametrize("rounding", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("factor", [2, 3])
def test_nearest_resize_is_imported_exactly_when_onnxruntime_repeats_each_entry(coord, rounding, factor) -> None:
    m = model([N("Resize", ["x", "", "sc"], ["y"], mode="nearest", coordinate_transformation_mode=coord,
                 nearest_mode=rounding)], [("x", [1, 2, 3, 4])], ["y"],
              [("sc", np.array([1, 1, factor, factor], np.float32))], opset=19, ir_version=9)
    feeds = random_feeds(m)
    (ref,) = run_ort(m, feeds)
    repeats = np.array_equal(ref, feeds["x"].repeat(factor, axis=2).repeat(factor, axis=3))
    bundle = tlb.import_onnx(m)
    if not repeats:  # the general resize op (tests/test_resize_modes.py), which follows onnx's reference
        assert "resize" in {n.kind for n in bundle.graph.nodes}
        (ref,) = ReferenceEvaluator(m).run(None, feeds)
    (ours,) = tlb.evaluate(bundle.graph, bundle.payload, [feeds["x"]], dtype="float32")
    np.testing.assert_array_equal(ours, ref)


def test_topk_indices_that_are_read_are_lowered() -> None:
    """(every TopK form: tests/test_select_ops.py)"""
    m = model([N("TopK", ["x", "k"], ["y", "i"]), N("Cast", ["i"], ["z"], to=1)], [("x", [2, 5])], ["y", "z"],
              [("k", i64(2))], opset=11)
    assert "topk_indices" in {n.kind for n in tlb.import_onnx(m).graph.nodes}


@pytest.mark.parametrize("shapes", [{"x": (3, -4)}, {"x": (3, 2.5)}, {"x": ("3", 4)}, {"x": 3}, [(True, 4)],
                                    {"x": "34"}])
def test_bad_input_shapes_are_bridge_errors(shapes) -> None:
    m = model([N("Relu", ["x"], ["y"])], [("x", ["batch", 4])], ["y"])
    with pytest.raises(tlb.BridgeError, match="input_shapes for `x` must be a sequence of non-negative ints"):
        tlb.import_onnx(m, input_shapes=shapes)


def test_external_data_without_its_file_is_a_bridge_error(tmp_path) -> None:
    m = model([N("MatMul", ["x", "W"], ["y"])], [("x", [2, 4])], ["y"], [("W", f32(4, 3))])
    onnx.save(m, str(tmp_path / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    loaded = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    with pytest.raises(tlb.BridgeError, match=r"cannot read initializer `W` \(external data `weights.bin`"):
        tlb.import_onnx(loaded)
    with pytest.raises(tlb.BridgeError, match=r"cannot read initializer `W`"):
        tlb.import_onnx(loaded.SerializeToString())
    assert tlb.import_onnx(tmp_path / "m.onnx").roles["W"].role == "weight"
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(tlb.BridgeError, match="ONNX import"):
        tlb.import_onnx(tmp_path / "m.onnx")


@pytest.mark.parametrize("op, inits, max_elements", [
    ("ConstantOfShape", [("s", i64(100_000, 100_000))], None),  # 1e10 floats: refused before allocation
    ("Range", [("a", np.array(0, np.int64)), ("b", np.array(3_000_000_000, np.int64)),
               ("c", np.array(1, np.int64))], None),
    ("Tile", [("d", np.ones((2, 3), np.int64)), ("r", i64(4, 5))], 100),  # int data: folded, not a parameter
    ("Expand", [("d", np.ones((3, 1), np.int64)), ("r", i64(2, 3, 40))], 100),
])
def test_folding_is_capped_by_max_elements_before_it_runs(op, inits, max_elements) -> None:
    m = model([N(op, [k for k, _ in inits], ["big_out"], name="big"), N("Shape", ["big_out"], ["s_out"]),
               N("Cast", ["s_out"], ["sf"], to=TP.FLOAT), N("ReduceSum", ["sf"], ["t"], keepdims=0),
               N("Add", ["x", "t"], ["y"])], [("x", [2])], ["y"], inits)
    kwargs = {} if max_elements is None else {"max_elements": max_elements}
    with pytest.raises(tlb.BridgeError, match=r"node `big` \(" + op + r"\): declared shape .* above the limit of"):
        tlb.import_onnx(m, **kwargs)
    if max_elements is not None:  # under a larger cap the fold runs and matches onnxruntime
        feeds = random_feeds(m)
        bundle = tlb.import_onnx(m, max_elements=1000)
        assert_close(tlb.evaluate(bundle.graph, bundle.payload, [feeds["x"]], dtype="float32"), run_ort(m, feeds))


def test_pow_broadcasts_its_constant_exponent_by_the_shared_rule() -> None:
    m = model([N("Pow", ["x", "e"], ["y"])], [("x", [2, 3])], ["y"], [("e", np.full((1, 1, 3), 3.0, np.float32))])
    feeds = random_feeds(m)
    bundle = tlb.import_onnx(m)
    assert_close(tlb.evaluate(bundle.graph, bundle.payload, [feeds["x"]], dtype="float32"), run_ort(m, feeds))
    bad = model([N("Pow", ["x", "e"], ["y"], name="p")], [("x", [2, 3])], ["y"],
                [("e", np.full((4,), 2.0, np.float32))])
    with pytest.raises(UnsupportedError,
                       match=r"node `p`, opset 17\): Pow: shapes \[2, 3\] and \[4\] do not broadcast"):
        tlb.import_onnx(bad)
