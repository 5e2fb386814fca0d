"""boundjax.io.onnx: every converter against onnxruntime, jit/vmap, bounds of loaded models, and the
VNN-COMP 2021 networks in the shared folder."""

from __future__ import annotations

import itertools
import pickle
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boundjax as bj
from boundjax.io import (CONVERTERS, OnnxImportError, UnsupportedOperatorError, crown_spec,
                         load_onnx, read_vnnlib, unsafe_rows_lower)

import onnx
import onnxruntime as ort  # a dev dependency (pyproject's "dev" extra)
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "vnncomp2021"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(),
                                  reason=f"the shared benchmark folder {SHARED} is absent")

RNG = np.random.default_rng(0)


# ----------------------------------------------------------------------------------------------
# Building tiny models with onnx.helper and running them both ways
# ----------------------------------------------------------------------------------------------

def make_model(nodes, x_shape, inits=None, opset=13, outputs=("y",), x_type=TensorProto.FLOAT):
  """A model with one input ``x`` of ``x_shape``, initializers ``inits`` (name -> array) and
  graph outputs ``outputs`` (float, shape left to the runtime)."""
  inits = inits or {}
  graph = helper.make_graph(
      nodes, "test",
      [helper.make_tensor_value_info("x", x_type, list(x_shape))],
      [helper.make_empty_tensor_value_info(o) for o in outputs],
      initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                            ir_version=8 if opset <= 17 else 9)
  return model


def run_ort(model, x):
  sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
  return sess.run(None, {"x": x})


def check(model, x, rtol=1e-5):
  """The loaded model equals onnxruntime on ``x`` (every output)."""
  loaded = load_onnx(model)
  ours = loaded(x)
  ours = ours if isinstance(ours, tuple) else (ours,)
  theirs = run_ort(model, x)
  assert len(ours) == len(theirs)
  for a, b in zip(ours, theirs):
    a = np.asarray(a)
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = max(1.0, float(np.max(np.abs(b)))) if b.size and b.dtype.kind == "f" else 1.0
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale)
  return loaded


def rand(*shape, lo=-1.0, hi=1.0):
  return RNG.uniform(lo, hi, size=shape).astype(np.float32)


_NAMES = itertools.count()


def node(op, inputs, outputs=("y",), **attrs):
  return helper.make_node(op, list(inputs), list(outputs), name=f"{op.lower()}_{next(_NAMES)}",
                          **attrs)


# One case per converter (and per opset variant): (id, nodes, x, inits, opset)
W = rand(4, 3)
CASES = [
    ("gemm", [node("Gemm", ["x", "w", "b"])], rand(2, 4), {"w": W, "b": rand(3)}, 13),
    ("gemm_trans_alpha_beta", [node("Gemm", ["x", "w", "b"], transA=1, transB=1, alpha=0.5,
                                    beta=2.0)], rand(4, 2), {"w": W.T.copy(), "b": rand(1, 3)}, 13),
    ("gemm_no_c", [node("Gemm", ["x", "w"])], rand(2, 4), {"w": W}, 13),
    ("matmul", [node("MatMul", ["x", "w"])], rand(2, 4), {"w": W}, 13),
    ("matmul_batched", [node("MatMul", ["x", "w"])], rand(2, 5, 4), {"w": W}, 13),
    ("add_broadcast", [node("Add", ["x", "b"])], rand(2, 3, 4), {"b": rand(4)}, 13),
    ("sub_broadcast", [node("Sub", ["b", "x"])], rand(2, 3, 4), {"b": rand(3, 1)}, 13),
    ("mul", [node("Mul", ["x", "b"])], rand(2, 3), {"b": rand(2, 3)}, 13),
    ("div", [node("Div", ["x", "b"])], rand(2, 3), {"b": rand(3, lo=0.5, hi=2)}, 13),
    ("neg", [node("Neg", ["x"])], rand(2, 3), None, 13),
    ("abs", [node("Abs", ["x"])], rand(2, 3), None, 13),
    ("sqrt", [node("Sqrt", ["x"])], rand(2, 3, lo=0.1, hi=2), None, 13),
    ("exp", [node("Exp", ["x"])], rand(2, 3), None, 13),
    ("log", [node("Log", ["x"])], rand(2, 3, lo=0.1, hi=2), None, 13),
    ("reciprocal", [node("Reciprocal", ["x"])], rand(2, 3, lo=0.5, hi=2), None, 13),
    ("pow_int", [node("Pow", ["x", "p"])], rand(2, 3), {"p": np.array(3.0, np.float32)}, 15),
    ("pow_half", [node("Pow", ["x", "p"])], rand(2, 3, lo=0.1, hi=2),
     {"p": np.array(0.5, np.float32)}, 15),
    ("max_min_sum_mean", [node("Max", ["x", "a"], ["m1"]), node("Min", ["m1", "b"], ["m2"]),
                          node("Sum", ["m2", "x", "a"], ["m3"]), node("Mean", ["m3", "x"])],
     rand(2, 3), {"a": rand(3), "b": rand(2, 3)}, 13),
    ("floor_ceil", [node("Floor", ["x"], ["f"]), node("Ceil", ["x"], ["c"]),
                    node("Add", ["f", "c"])], rand(2, 3, lo=-3, hi=3), None, 13),
    ("erf", [node("Erf", ["x"])], rand(2, 3), None, 13),
    ("relu", [node("Relu", ["x"])], rand(2, 3), None, 14),
    ("leaky_relu", [node("LeakyRelu", ["x"], alpha=0.2)], rand(2, 3), None, 16),
    ("leaky_relu_default", [node("LeakyRelu", ["x"])], rand(2, 3), None, 6),
    ("sigmoid", [node("Sigmoid", ["x"])], rand(2, 3, lo=-4, hi=4), None, 13),
    ("tanh", [node("Tanh", ["x"])], rand(2, 3, lo=-3, hi=3), None, 13),
    ("softplus", [node("Softplus", ["x"])], rand(2, 3, lo=-3, hi=3), None, 13),
    ("softmax", [node("Softmax", ["x"], axis=1)], rand(2, 5, 3, lo=-3, hi=3), None, 13),
    ("softmax_default_axis", [node("Softmax", ["x"])], rand(2, 5, lo=-3, hi=3), None, 13),
    ("softmax_opset11_coerced", [node("Softmax", ["x"], axis=1)], rand(2, 5, 3, lo=-3, hi=3),
     None, 11),
    ("log_softmax", [node("LogSoftmax", ["x"], axis=-1)], rand(2, 5, lo=-3, hi=3), None, 13),
    ("clip", [node("Clip", ["x", "lo", "hi"])], rand(2, 3, lo=-2, hi=2),
     {"lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)}, 13),
    ("clip_min_only", [node("Clip", ["x", "lo"])], rand(2, 3, lo=-2, hi=2),
     {"lo": np.array(-0.5, np.float32)}, 13),
    ("clip_max_only", [node("Clip", ["x", "", "hi"])], rand(2, 3, lo=-2, hi=2),
     {"hi": np.array(0.3, np.float32)}, 13),
    ("clip_opset6", [node("Clip", ["x"], min=-0.5, max=0.5)], rand(2, 3, lo=-2, hi=2), None, 6),
    ("conv", [node("Conv", ["x", "w", "b"])], rand(2, 3, 6, 6), {"w": rand(4, 3, 3, 3),
                                                                 "b": rand(4)}, 11),
    ("conv_stride_pad_dilate", [node("Conv", ["x", "w"], strides=[2, 1], pads=[1, 0, 2, 1],
                                     dilations=[1, 2])], rand(1, 3, 7, 8),
     {"w": rand(4, 3, 3, 2)}, 11),
    ("conv_group", [node("Conv", ["x", "w", "b"], group=2, kernel_shape=[3, 3])],
     rand(1, 4, 5, 5), {"w": rand(6, 2, 3, 3), "b": rand(6)}, 11),
    ("conv_depthwise", [node("Conv", ["x", "w"], group=3, pads=[1, 1, 1, 1])], rand(1, 3, 5, 5),
     {"w": rand(3, 1, 3, 3)}, 11),
    ("conv_same_upper", [node("Conv", ["x", "w"], auto_pad="SAME_UPPER", strides=[2, 2])],
     rand(1, 2, 7, 6), {"w": rand(3, 2, 4, 3)}, 11),
    ("conv_same_lower", [node("Conv", ["x", "w"], auto_pad="SAME_LOWER")], rand(1, 2, 6, 6),
     {"w": rand(3, 2, 2, 2)}, 11),
    ("conv_valid", [node("Conv", ["x", "w"], auto_pad="VALID")], rand(1, 2, 6, 6),
     {"w": rand(3, 2, 3, 3)}, 11),
    ("conv_1d", [node("Conv", ["x", "w", "b"], pads=[1, 2], strides=[2])], rand(2, 3, 9),
     {"w": rand(5, 3, 3), "b": rand(5)}, 11),
    ("conv_transpose", [node("ConvTranspose", ["x", "w", "b"], strides=[2, 2])],
     rand(1, 3, 4, 4), {"w": rand(3, 2, 3, 3), "b": rand(2)}, 11),
    ("conv_transpose_pads_outpad_group", [node("ConvTranspose", ["x", "w"], strides=[2, 2],
                                               pads=[1, 0, 1, 1], output_padding=[1, 0],
                                               group=2, dilations=[1, 2])],
     rand(1, 4, 4, 3), {"w": rand(4, 3, 3, 2)}, 11),
    ("batch_norm", [node("BatchNormalization", ["x", "s", "b", "m", "v"], epsilon=1e-3)],
     rand(2, 3, 4, 4), {"s": rand(3), "b": rand(3), "m": rand(3), "v": rand(3, lo=0.5, hi=2)}, 15),
    ("max_pool", [node("MaxPool", ["x"], kernel_shape=[2, 2], strides=[2, 2])],
     rand(2, 3, 6, 6), None, 12),
    ("max_pool_pads", [node("MaxPool", ["x"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
     rand(1, 2, 5, 5), None, 12),
    ("max_pool_ceil_dilate", [node("MaxPool", ["x"], kernel_shape=[3, 2], strides=[2, 2],
                                   ceil_mode=1, dilations=[1, 2])], rand(1, 2, 8, 9), None, 12),
    ("max_pool_same_upper", [node("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2],
                                  auto_pad="SAME_UPPER")], rand(1, 2, 7, 6), None, 12),
    ("max_pool_1d", [node("MaxPool", ["x"], kernel_shape=[3], strides=[2])], rand(2, 3, 9),
     None, 12),
    ("avg_pool", [node("AveragePool", ["x"], kernel_shape=[2, 2], strides=[2, 2])],
     rand(2, 3, 6, 6), None, 19),
    ("avg_pool_pads_exclude", [node("AveragePool", ["x"], kernel_shape=[3, 3],
                                    pads=[1, 1, 1, 1])], rand(1, 2, 5, 5), None, 19),
    ("avg_pool_pads_include", [node("AveragePool", ["x"], kernel_shape=[3, 3], strides=[2, 2],
                                    pads=[1, 1, 1, 1], count_include_pad=1)],
     rand(1, 2, 6, 6), None, 19),
    ("avg_pool_ceil", [node("AveragePool", ["x"], kernel_shape=[3, 3], strides=[2, 2],
                            ceil_mode=1)], rand(1, 2, 8, 8), None, 19),
    ("global_average_pool", [node("GlobalAveragePool", ["x"])], rand(2, 3, 4, 5), None, 13),
    ("global_max_pool", [node("GlobalMaxPool", ["x"])], rand(2, 3, 4, 5), None, 13),
    ("reduce_sum", [node("ReduceSum", ["x", "axes"], keepdims=0)], rand(2, 3, 4),
     {"axes": np.array([1, -1], np.int64)}, 13),
    ("reduce_mean_max_min", [node("ReduceMean", ["x"], ["a"], axes=[1]),
                             node("ReduceMax", ["x"], ["b"], axes=[1]),
                             node("ReduceMin", ["x"], ["c"], axes=[1], keepdims=1),
                             node("Sum", ["a", "b", "c"])], rand(2, 3, 4), None, 13),
    ("flatten", [node("Flatten", ["x"])], rand(2, 3, 4), None, 13),
    ("flatten_axis0", [node("Flatten", ["x"], axis=0)], rand(2, 3, 4), None, 13),
    ("flatten_axis_neg", [node("Flatten", ["x"], axis=-1)], rand(2, 3, 4), None, 13),
    ("reshape", [node("Reshape", ["x", "s"])], rand(2, 3, 4),
     {"s": np.array([0, -1, 2], np.int64)}, 14),
    ("transpose", [node("Transpose", ["x"], perm=[2, 0, 1])], rand(2, 3, 4), None, 13),
    ("transpose_default", [node("Transpose", ["x"])], rand(2, 3, 4), None, 13),
    ("squeeze", [node("Squeeze", ["x", "a"])], rand(2, 1, 3, 1), {"a": np.array([1], np.int64)},
     13),
    ("squeeze_all", [node("Squeeze", ["x"])], rand(2, 1, 3, 1), None, 13),
    ("squeeze_opset11", [node("Squeeze", ["x"], axes=[-1])], rand(2, 1, 3, 1), None, 11),
    ("unsqueeze", [node("Unsqueeze", ["x", "a"])], rand(2, 3), {"a": np.array([0, -1], np.int64)},
     13),
    ("unsqueeze_opset11", [node("Unsqueeze", ["x"], axes=[1, 3])], rand(2, 3), None, 11),
    ("concat", [node("Concat", ["x", "c", "x"], axis=-1)], rand(2, 3), {"c": rand(2, 2)}, 13),
    ("split", [node("Split", ["x", "s"], ["y", "z"], axis=1)], rand(2, 5),
     {"s": np.array([2, 3], np.int64)}, 13),
    ("split_equal", [node("Split", ["x"], ["y", "z", "w"], axis=1)], rand(2, 6), None, 13),
    ("slice", [node("Slice", ["x", "st", "en", "ax", "sp"])], rand(5, 6, 7),
     {"st": np.array([1, -1, 0], np.int64), "en": np.array([4, -100, 2**63 - 1], np.int64),
      "ax": np.array([0, 1, 2], np.int64), "sp": np.array([2, -2, 3], np.int64)}, 13),
    ("slice_no_axes", [node("Slice", ["x", "st", "en"])], rand(5, 6),
     {"st": np.array([-3], np.int64), "en": np.array([10], np.int64)}, 13),
    ("slice_opset9", [node("Slice", ["x"], starts=[1, 0], ends=[3, -1], axes=[0, 1])],
     rand(5, 6), None, 9),
    ("gather", [node("Gather", ["x", "i"], axis=1)], rand(2, 5, 3),
     {"i": np.array([[0, -1], [2, 2]], np.int64)}, 13),
    ("gather_scalar", [node("Gather", ["x", "i"])], rand(4, 3), {"i": np.array(-2, np.int64)},
     13),
    ("pad_constant", [node("Pad", ["x", "p", "v"])], rand(2, 3, 4),
     {"p": np.array([0, 1, 2, 0, 2, -1], np.int64), "v": np.array(0.5, np.float32)}, 13),
    ("pad_reflect", [node("Pad", ["x", "p"], mode="reflect")], rand(2, 3, 4),
     {"p": np.array([0, 0, 1, 0, 1, 2], np.int64)}, 13),
    ("pad_edge", [node("Pad", ["x", "p"], mode="edge")], rand(2, 3, 4),
     {"p": np.array([0, 1, 2, 0, 1, 0], np.int64)}, 13),
    ("pad_opset2", [node("Pad", ["x"], pads=[0, 1, 1, 0], value=-1.0)], rand(2, 3), None, 2),
    ("expand", [node("Expand", ["x", "s"])], rand(3, 1), {"s": np.array([2, 3, 4], np.int64)}, 13),
    ("tile", [node("Tile", ["x", "r"])], rand(2, 3), {"r": np.array([2, 1], np.int64)}, 13),
    ("constant", [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(
        rand(2, 3))), node("Add", ["x", "c"])], rand(2, 3), None, 13),
    ("constant_value_floats", [helper.make_node("Constant", [], ["c"], value_floats=[1.0, 2.0,
                                                                                     3.0]),
                               node("Mul", ["x", "c"])], rand(2, 3), None, 13),
    ("constant_of_shape", [node("Shape", ["x"], ["s"]),
                           node("ConstantOfShape", ["s"], ["c"], value=numpy_helper.from_array(
                               np.array([0.25], np.float32))), node("Add", ["x", "c"])],
     rand(2, 3), None, 13),
    ("identity_dropout", [node("Identity", ["x"], ["i"]), node("Dropout", ["i"])], rand(2, 3),
     None, 13),
    ("cast_roundtrip", [node("Cast", ["x"], ["c"], to=TensorProto.INT32),
                        node("Cast", ["c"], to=TensorProto.FLOAT)], rand(2, 3, lo=-5, hi=5),
     None, 13),
    ("cast_double", [node("Cast", ["x"], ["c"], to=TensorProto.DOUBLE),
                     node("Cast", ["c"], to=TensorProto.FLOAT)], rand(2, 3), None, 13),
    ("where_compare", [node("Greater", ["x", "z"], ["g"]), node("Where", ["g", "x", "z"])],
     rand(2, 3), {"z": np.array(0.1, np.float32)}, 16),
    ("hard_sigmoid", [node("HardSigmoid", ["x"])], rand(2, 5, lo=-4, hi=4), None, 6),
    ("hard_sigmoid_alpha_beta", [node("HardSigmoid", ["x"], alpha=0.3, beta=0.4)],
     rand(2, 5, lo=-4, hi=4), None, 6),
    ("hard_swish", [node("HardSwish", ["x"])], rand(2, 5, lo=-5, hi=5), None, 14),
    ("gelu", [node("Gelu", ["x"])], rand(2, 5, lo=-4, hi=4), None, 20),
    ("gelu_tanh", [node("Gelu", ["x"], approximate="tanh")], rand(2, 5, lo=-4, hi=4), None, 20),
    ("layer_norm", [node("LayerNormalization", ["x", "s", "b"])], rand(2, 3, 6),
     {"s": rand(6), "b": rand(6)}, 17),
    ("layer_norm_axis_no_bias", [node("LayerNormalization", ["x", "s"], axis=-2, epsilon=1e-3)],
     rand(2, 3, 6), {"s": rand(3, 6)}, 17),
    ("layer_norm_statistics", [node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv"],
                                    axis=1)], rand(2, 3, 4), {"s": rand(3, 4), "b": rand(4)}, 17),
]


def test_every_case_has_a_converter_and_every_converter_a_case():
  ops = {n.op_type for _, nodes, *_ in CASES for n in nodes}
  assert ops <= set(CONVERTERS)
  untested = set(CONVERTERS) - ops - {"Equal", "Less", "LessOrEqual", "GreaterOrEqual", "Not",
                                      "And", "Or", "Xor", "Size", "Range"}
  assert not untested  # the rest are covered by the shape-driven graphs below


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_converter_matches_onnxruntime(case):
  name, nodes, x, inits, opset = case
  outputs = tuple(o for n in nodes[-1:] for o in n.output)
  check(make_model(nodes, x.shape, inits, opset, outputs=outputs), x)


def test_params_are_the_float_initializers_and_static_inputs_are_constants():
  model = make_model([node("Reshape", ["x", "s"], ["r"]), node("Gemm", ["r", "w", "b"])],
                     (2, 2, 2), {"s": np.array([2, 4], np.int64), "w": rand(4, 3), "b": rand(3)})
  loaded = load_onnx(model)
  assert set(loaded.params) == {"w", "b"}
  apply_fn, params = loaded
  assert params is loaded.params and apply_fn is loaded.apply_fn
  assert loaded.input_shape == (2, 2, 2) and loaded.output_shape == (2, 3)
  assert loaded.input_name == "x" and loaded.output_name == "y"
  x = rand(2, 2, 2)
  new = {k: v * 2 for k, v in params.items()}  # params are real leaves: replacing them counts
  np.testing.assert_allclose(apply_fn(new, x), 2 * apply_fn(params, x), rtol=1e-5)


# ----------------------------------------------------------------------------------------------
# Graphs of several operators
# ----------------------------------------------------------------------------------------------

def shape_driven_reshape_model():
  """PyTorch's ``x.view(x.size(0), -1)``: Shape -> Gather -> Unsqueeze -> Concat -> Reshape,
  plus a Where/Equal/Range/Size detour that folds too."""
  nodes = [
      node("Shape", ["x"], ["shape"]),
      node("Gather", ["shape", "zero"], ["batch"], axis=0),
      node("Unsqueeze", ["batch", "axes0"], ["batch1"]),
      node("Concat", ["batch1", "minus1"], ["target"], axis=0),
      node("Equal", ["target", "minus1b"], ["is_m1"]),
      node("Not", ["is_m1"], ["not_m1"]),
      node("And", ["not_m1", "not_m1"], ["keep"]),
      node("Where", ["keep", "target", "minus1b"], ["target2"]),
      node("Size", ["x"], ["size"]),
      node("Range", ["zero", "two", "one"], ["r"]),
      node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
      node("Reshape", ["x", "target2"], ["flat"]),
      node("MatMul", ["flat", "w"], ["h"]),
      node("ReduceSum", ["rf"], ["rs"], keepdims=0),
      node("Add", ["h", "rs"], ["y"]),
  ]
  inits = {"zero": np.array(0, np.int64), "axes0": np.array([0], np.int64),
           "minus1": np.array([-1], np.int64), "minus1b": np.array([-1, -1], np.int64),
           "two": np.array(2, np.int64), "one": np.array(1, np.int64), "w": rand(12, 4)}
  return make_model(nodes, (3, 3, 4), inits, 13)


def test_shape_driven_reshape_folds_at_load_time():
  model = shape_driven_reshape_model()
  loaded = check(model, rand(3, 3, 4))
  jaxpr = jax.make_jaxpr(loaded.apply_fn)(loaded.params, rand(3, 3, 4))
  prims = {e.primitive.name for e in jaxpr.jaxpr.eqns}
  assert prims <= {"reshape", "dot_general", "add"}, prims  # no shape arithmetic left


def conv_bn_relu_pool_gemm_model(opset=13):
  nodes = [
      node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1]),
      node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
      node("Relu", ["n"], ["r"]),
      node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
      node("Flatten", ["p"], ["f"]),
      node("Gemm", ["f", "gw", "gb"], ["y"], transB=1),
  ]
  inits = {"cw": rand(4, 2, 3, 3), "cb": rand(4), "s": rand(4), "b": rand(4), "m": rand(4),
           "v": rand(4, lo=0.5, hi=2), "gw": rand(3, 4 * 3 * 3), "gb": rand(3)}
  return make_model(nodes, (1, 2, 6, 6), inits, opset)


def test_conv_bn_relu_maxpool_flatten_gemm():
  check(conv_bn_relu_pool_gemm_model(), rand(1, 2, 6, 6))


def test_jit_and_vmap_of_apply_fn():
  loaded = load_onnx(conv_bn_relu_pool_gemm_model())
  xs = rand(5, 1, 2, 6, 6)
  direct = np.stack([np.asarray(loaded(x)) for x in xs])
  jitted = jax.jit(loaded.apply_fn)
  np.testing.assert_allclose(np.stack([jitted(loaded.params, x) for x in xs]), direct,
                             rtol=1e-5, atol=1e-5)
  batched = jax.jit(jax.vmap(loaded.apply_fn, in_axes=(None, 0)))(loaded.params, xs)
  assert batched.shape == (5, 1, 3)
  np.testing.assert_allclose(batched, direct, rtol=1e-5, atol=1e-5)
  grads = jax.grad(lambda x: loaded.apply_fn(loaded.params, x).sum())(xs[0])
  assert grads.shape == xs[0].shape
  with pytest.raises(ValueError, match=r"full shape \(B, 1, 2, 6, 6\) is what model.batched takes"):
    loaded(xs)


def test_a_batch_in_place_of_the_files_batch_dimension_of_1():
  model = conv_bn_relu_pool_gemm_model()          # input (1, 2, 6, 6), output (1, 3)
  loaded = load_onnx(model)
  xs = rand(5, 2, 6, 6)
  theirs = np.concatenate([run_ort(model, x[None])[0] for x in xs])
  for ys in (loaded(xs), loaded.apply_fn(loaded.params, xs), jax.jit(loaded.apply_fn)(
      loaded.params, xs), loaded.batched(loaded.params, xs)):
    assert ys.shape == (5, 3)
    np.testing.assert_allclose(ys, theirs, rtol=1e-5, atol=1e-5)
  old = loaded.batched(loaded.params, xs[:, None])   # the old call, (B, *input_shape)
  assert old.shape == (5, 1, 3)
  np.testing.assert_allclose(old[:, 0], theirs, rtol=1e-5, atol=1e-5)
  assert loaded(xs[:1]).shape == (1, 3)               # B = 1 is the model's own shape


def test_a_graph_that_hard_codes_its_batch_of_1_takes_a_user_batch():
  model = make_model([node("Reshape", ["x", "s"], ["r"]), node("MatMul", ["r", "w"])], (1, 2, 3),
                     {"s": np.array([1, 6], np.int64), "w": rand(6, 4)})
  loaded = load_onnx(model)
  xs = rand(7, 2, 3)
  ys = loaded(xs)
  assert ys.shape == (7, 4)
  np.testing.assert_allclose(ys, np.concatenate([run_ort(model, x[None])[0] for x in xs]),
                             rtol=1e-5, atol=1e-5)


def test_bounds_of_a_user_batch_of_boxes_enclose_samples():
  loaded = load_onnx(small_mlp_model())               # input (1, 3)
  lo = rand(4, 3, lo=-1, hi=0.5)
  hi = lo + 0.2
  boxes = bj.Interval(jnp.asarray(lo), jnp.asarray(hi))
  samples = lo + (hi - lo) * RNG.random((2000, 4, 3)).astype(np.float32)
  ys = np.stack([np.asarray(loaded(s)) for s in samples[:200]])
  ibp = bj.ibp(loaded.apply_fn)(loaded.params, boxes)
  crown = bj.crown(loaded.apply_fn)(loaded.params, boxes)     # batch_axis=0: one box per row
  for out in (ibp, crown):
    assert out.lower.shape == (4, 2)
    assert enclosed(out, ys)
  # the same bounds as the old call, model.batched on boxes (B, *input_shape)
  old = bj.crown(loaded.batched)(loaded.params, bj.Interval(jnp.asarray(lo[:, None]),
                                                           jnp.asarray(hi[:, None])))
  np.testing.assert_allclose(crown.lower, old.lower[:, 0], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(crown.upper, old.upper[:, 0], rtol=1e-6, atol=1e-6)


def test_shape_errors_say_what_was_passed_and_never_recommend_the_function_called():
  loaded = load_onnx(conv_bn_relu_pool_gemm_model())  # input (1, 2, 6, 6)
  cases = [(loaded.apply_fn, "apply_fn", (3, 2, 6, 7)), (loaded.apply_fn, "apply_fn", (2, 6, 6)),
           (loaded.apply_fn, "apply_fn", (3, 1, 2, 6, 6)),
           (loaded.batched, "model.batched", (3, 2, 6, 7)),
           (loaded.batched, "model.batched", (2, 6, 6)),
           (loaded.batched, "model.batched", (4, 3, 1, 2, 6, 6))]
  for fn, name, shape in cases:
    with pytest.raises(ValueError) as info:
      fn(loaded.params, np.zeros(shape, np.float32))
    msg = str(info.value)
    assert f"got an input of shape {shape}" in msg, msg
    assert msg.count(name) == 1, msg                   # named as the callee, never as the advice
  with pytest.raises(ValueError, match=r"add the batch dimension of 1: x\[None\]"):
    loaded(np.zeros((2, 6, 6), np.float32))
  # a file whose first dimension is not 1: apply_fn takes exactly its shape
  other = load_onnx(make_model([node("Relu", ["x"])], (2, 3)))
  with pytest.raises(ValueError, match=r"apply_fn takes an input of the model's shape \(2, 3\);"):
    other(np.zeros((4, 3), np.float32))
  with pytest.raises(ValueError, match="For one input of the model's shape, call model.apply_fn"):
    other.batched(other.params, np.zeros((2, 3), np.float32))


def test_a_loaded_model_pickles():
  loaded = load_onnx(conv_bn_relu_pool_gemm_model())
  x = rand(1, 2, 6, 6)
  loaded.batched  # noqa: B018 (a cached vmap, left out of the pickle)
  again = pickle.loads(pickle.dumps(loaded))
  np.testing.assert_array_equal(again(x), loaded(x))
  assert again.input_shape == loaded.input_shape and "onnx_" in repr(again.apply_fn)


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------

def test_unsupported_operator_names_op_node_and_file(tmp_path):
  model = make_model([node("Relu", ["x"], ["r"]),
                      helper.make_node("LpNormalization", ["r"], ["y"], name="the_norm")],
                     (2, 3))
  path = tmp_path / "net.onnx"
  onnx.save(model, path)
  with pytest.raises(UnsupportedOperatorError) as info:
    load_onnx(path)
  msg = str(info.value)
  assert "'LpNormalization'" in msg and "'the_norm'" in msg and str(path) in msg
  assert isinstance(info.value, NotImplementedError) and isinstance(info.value, ValueError)


def test_unsupported_operator_unnamed_node_and_custom_domain():
  model = make_model([helper.make_node("Einsum", ["x", "x"], ["y"], equation="ij,ij->i")], (2, 3),
                     opset=13)
  with pytest.raises(UnsupportedOperatorError, match=r"Einsum node #0 \(unnamed"):
    load_onnx(model)
  model = make_model([helper.make_node("Relu", ["x"], ["y"], name="r", domain="com.example")],
                     (2, 3))
  model.opset_import.append(helper.make_opsetid("com.example", 1))
  with pytest.raises(UnsupportedOperatorError, match="domain 'com.example'"):
    load_onnx(model)


def test_dynamic_value_where_a_static_one_is_needed():
  model = make_model([node("Cast", ["x"], ["s"], to=TensorProto.INT64),
                      node("Reshape", ["x", "s"])], (2,))
  with pytest.raises(OnnxImportError, match="target shape must be a constant"):
    load_onnx(model)


def test_unreadable_file_and_bad_input_shape(tmp_path):
  bad = tmp_path / "bad.onnx"
  bad.write_bytes(b"not a protobuf at all \x00\x01")
  with pytest.raises(OnnxImportError, match="bad.onnx"):
    load_onnx(bad)
  with pytest.raises(OnnxImportError, match="input_shape"):
    load_onnx(make_model([node("Relu", ["x"])], (2, 3)), input_shape=(3, 3))


def test_symbolic_batch_dimension_is_fixed_at_load_time():
  model = make_model([node("Gemm", ["x", "w"])], ("N", 4), {"w": W})
  assert load_onnx(model).input_shape == (1, 4)
  loaded = load_onnx(model, input_shape=(7, 4))
  assert loaded.input_shape == (7, 4) and loaded.output_shape == (7, 3)
  x = rand(7, 4)
  np.testing.assert_allclose(loaded(x), run_ort(model, x)[0], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# Bounds of loaded models
# ----------------------------------------------------------------------------------------------

def small_mlp_model():
  nodes = [node("Gemm", ["x", "w1", "b1"], ["h1"], transB=1), node("Relu", ["h1"], ["r1"]),
           node("Gemm", ["r1", "w2", "b2"], ["h2"]), node("LeakyRelu", ["h2"], ["r2"], alpha=0.1),
           node("MatMul", ["r2", "w3"], ["h3"]), node("Add", ["h3", "b3"], ["y"])]
  inits = {"w1": rand(8, 3), "b1": rand(8), "w2": rand(8, 6), "b2": rand(6), "w3": rand(6, 2),
           "b3": rand(2)}
  return make_model(nodes, (1, 3), inits, 13)


def enclosed(out: bj.Interval, ys) -> bool:
  lo, hi = np.asarray(out.lower), np.asarray(out.upper)
  ys = np.asarray(ys)
  slack = 1e-5 * (1 + np.abs(ys))
  return bool(np.all(ys >= lo - slack) and np.all(ys <= hi + slack))


def test_ibp_and_crown_of_a_loaded_model_enclose_samples_and_corners():
  loaded = load_onnx(small_mlp_model())
  lo = np.array([[-0.5, 0.1, -1.0]], np.float32)
  hi = np.array([[0.3, 0.4, -0.2]], np.float32)
  box = bj.Interval(jnp.asarray(lo), jnp.asarray(hi))
  corners = np.array([[np.where(bits, hi[0], lo[0])] for bits in
                      itertools.product([0, 1], repeat=3)], np.float32)
  samples = np.concatenate([corners, lo + (hi - lo) * RNG.random((10_000, 1, 3))
                            .astype(np.float32)])
  ys = jax.jit(jax.vmap(loaded.apply_fn, in_axes=(None, 0)))(loaded.params, samples)
  ibp = bj.ibp(loaded.apply_fn)(loaded.params, box)
  crown = bj.crown(loaded.apply_fn, batch_axis=None)(loaded.params, box)
  crown_b = bj.crown(loaded.apply_fn)(loaded.params, box)  # the model's batch axis of 1
  for out in (ibp, crown, crown_b):
    assert out.lower.shape == (1, 2)
    assert enclosed(out, ys)
  assert np.all(np.asarray(crown.upper - crown.lower) <= np.asarray(ibp.upper - ibp.lower) + 1e-5)


@pytest.mark.filterwarnings("ignore:bj.crown. no linear relaxation for 'boundjax_softmax'")
def test_crown_of_a_conv_pool_softmax_model_encloses_samples():
  model = conv_bn_relu_pool_gemm_model()
  model.graph.node.append(node("Softmax", ["y"], ["prob"], axis=-1))
  model.graph.output[0].name = "prob"
  loaded = load_onnx(model)
  x = rand(1, 2, 6, 6)
  box = bj.Interval(jnp.asarray(x - 0.05), jnp.asarray(x + 0.05))
  samples = x + RNG.uniform(-0.05, 0.05, size=(2000, 1, 2, 6, 6)).astype(np.float32)
  samples = np.concatenate([samples, x + 0.05 * np.sign(RNG.standard_normal((200,) + x.shape))
                            .astype(np.float32)])
  ys = jax.jit(jax.vmap(loaded.apply_fn, in_axes=(None, 0)))(loaded.params, samples)
  for out in (bj.ibp(loaded.apply_fn)(loaded.params, box),
              bj.crown(loaded.apply_fn, batch_axis=None)(loaded.params, box)):
    assert enclosed(out, ys)
    assert np.all(np.asarray(out.lower) >= -1e-6) and np.all(np.asarray(out.upper) <= 1 + 1e-6)


def test_an_operator_no_domain_bounds_is_named_in_the_error():
  model = make_model([node("Greater", ["x", "a"], ["g1"]), node("Greater", ["x", "b"], ["g2"]),
                      helper.make_node("Xor", ["g1", "g2"], ["c"], name="the_xor"),
                      node("Where", ["c", "x", "a"])], (1, 3),
                     {"a": np.array(0.0, np.float32), "b": np.array(0.5, np.float32)})
  loaded = load_onnx(model)
  box = bj.Interval(-jnp.ones((1, 3)), jnp.ones((1, 3)))
  for bound in (bj.ibp(loaded.apply_fn), bj.crown(loaded.apply_fn, batch_axis=None)):
    with pytest.raises(bj.UnsupportedPrimitiveError, match="in ONNX Xor node 'the_xor'"):
      bound(loaded.params, box)


# ----------------------------------------------------------------------------------------------
# Networks exported by PyTorch 2.13 (tests/data/make_torch_exports.py): its default exporter
# (torch.export, opset 20: LayerNormalization, Gelu, HardSwish, HardSigmoid, ...) and the
# TorchScript one (dynamo=False, opset 17: GELU as Erf / Tanh arithmetic, Expand, Where, ...)
# ----------------------------------------------------------------------------------------------

DATA = Path(__file__).resolve().parent / "data"
TORCH_EXPORTS = sorted(DATA.glob("torch_*.onnx"))


def test_the_torch_exports_are_present_small_and_use_the_operators_they_test():
  assert [p.name for p in TORCH_EXPORTS] == ["torch_block_dynamo.onnx", "torch_block_script.onnx",
                                             "torch_cnn_dynamo.onnx", "torch_cnn_script.onnx"]
  ops = {p.stem: {n.op_type for n in onnx.load(p).graph.node} for p in TORCH_EXPORTS}
  assert all(p.stat().st_size < 200_000 for p in TORCH_EXPORTS)
  assert {"LayerNormalization", "Gelu", "HardSwish", "HardSigmoid", "Where", "Gather",
          "Concat"} <= ops["torch_block_dynamo"]
  assert {"LayerNormalization", "Erf", "Tanh", "HardSwish", "HardSigmoid", "Where", "Expand",
          "Gather"} <= ops["torch_block_script"]
  assert {"Conv", "BatchNormalization", "MaxPool", "AveragePool", "Gemm"} <= \
      ops["torch_cnn_dynamo"] & ops["torch_cnn_script"]


@pytest.mark.parametrize("path", TORCH_EXPORTS, ids=[p.stem for p in TORCH_EXPORTS])
def test_torch_export_matches_onnxruntime(path):
  loaded = load_onnx(path)
  assert loaded.input_shape in ((1, 1, 28, 28), (1, 4, 8))
  sess = _ort_session(path)
  rng = np.random.default_rng(5)
  xs = rng.standard_normal((8,) + loaded.input_shape).astype(np.float32)
  ours = np.asarray(jax.jit(loaded.batched)(loaded.params, xs))
  theirs = np.stack([sess.run(None, {loaded.input_name: x})[0] for x in xs])
  assert ours.shape == theirs.shape
  np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5 * np.abs(theirs).max())


def _box_points(lo: np.ndarray, hi: np.ndarray, n: int, n_corners: int, rng) -> np.ndarray:
  """``n`` uniform points of the box ``[lo, hi]``, ``n_corners`` random corners and the two
  extreme corners ``lo``, ``hi`` (float32, shape ``(count, *lo.shape)``)."""
  u = rng.random((n,) + lo.shape)
  corners = rng.integers(0, 2, (n_corners,) + lo.shape).astype(bool)
  pts = np.concatenate([lo + (hi - lo) * u, np.where(corners, hi, lo), lo[None], hi[None]])
  return np.clip(pts.astype(np.float32), lo, hi)


def _float64_outputs(loaded, xs: np.ndarray) -> np.ndarray:
  """The network in float64 on every point (the float32 weights are exact in float64)."""
  with jax.enable_x64(True):
    params = {k: jnp.asarray(v, jnp.float64) for k, v in loaded.params.items()}
    fn = jax.jit(jax.vmap(loaded.apply_fn, in_axes=(None, 0)))
    return np.asarray(fn(params, jnp.asarray(xs, jnp.float64)))


# radius of the box around a random centre: the transformer block's LayerNorms amplify widths
# (interval arithmetic loses the tie between x - mean and the standard deviation)
TORCH_RADIUS = {"torch_cnn": 0.02, "torch_block": 0.001}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:bj.crown. no linear relaxation")
@pytest.mark.parametrize("path", TORCH_EXPORTS, ids=[p.stem for p in TORCH_EXPORTS])
def test_bounds_of_a_torch_export_enclose_samples_and_corners(path):
  loaded = load_onnx(path)
  rng = np.random.default_rng(6)
  centre = rng.uniform(-1, 1, loaded.input_shape).astype(np.float32)
  r = TORCH_RADIUS[path.stem.rsplit("_", 1)[0]]
  lo, hi = centre - r, centre + r
  box = bj.Interval(jnp.asarray(lo), jnp.asarray(hi))
  xs = _box_points(lo, hi, 10_000, 500, rng)
  ys = np.asarray(jax.jit(loaded.batched)(loaded.params, xs))
  ys64 = _float64_outputs(loaded, xs)
  bounds = {"ibp": jax.jit(bj.ibp(loaded.apply_fn))(loaded.params, box),
            "crown": jax.jit(bj.crown(loaded.apply_fn, batch_axis=None, intermediate="ibp"))(
                loaded.params, box),
            "ibp_sound": jax.jit(bj.ibp(loaded.apply_fn, sound=True))(loaded.params, box)}
  for name, out in bounds.items():
    assert out.lower.shape == loaded.output_shape, name
    assert np.all(np.isfinite(np.asarray(out.lower))) and np.all(np.isfinite(np.asarray(out.upper)))
    assert enclosed(out, ys), name
  low, up = (np.asarray(v, np.float64) for v in (bounds["ibp_sound"].lower,
                                                   bounds["ibp_sound"].upper))
  assert np.all(ys64 >= low) and np.all(ys64 <= up)   # sound mode: no slack, against float64


# ----------------------------------------------------------------------------------------------
# The VNN-COMP 2021 networks in the shared folder
# ----------------------------------------------------------------------------------------------

def _ort_session(path):
  return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _points_in(prop, n, rng):
  """``n`` random points (float32) in each region of a property, plus its box's two corners."""
  pts = []
  for r in prop.regions:
    pts.append(r.lower + (r.upper - r.lower) * rng.random((n, r.lower.size)))
    pts += [r.lower[None], r.upper[None]]
  return np.concatenate(pts).astype(np.float32)


ACAS = sorted(SHARED.glob("acasxu/*.onnx")) if SHARED.is_dir() else []


@needs_shared
def test_every_shared_network_is_found():
  assert len(ACAS) == 18
  assert (SHARED / "mnistfc" / "mnist-net_256x2.onnx").is_file()


@needs_shared
@pytest.mark.parametrize("path", ACAS, ids=[p.stem for p in ACAS])
def test_acasxu_network_matches_onnxruntime_inside_the_property_boxes(path):
  loaded = load_onnx(path)
  assert loaded.input_shape == (1, 1, 1, 5) and loaded.output_shape == (1, 5)
  rng = np.random.default_rng(abs(hash(path.stem)) % 2**32)
  xs = np.concatenate([_points_in(read_vnnlib(SHARED / "acasxu" / f"prop_{k}.vnnlib"), 3, rng)
                       for k in range(1, 11)]).reshape(-1, 1, 1, 1, 5)
  ours = np.asarray(jax.jit(jax.vmap(loaded.apply_fn, in_axes=(None, 0)))(loaded.params, xs))
  sess = _ort_session(path)
  theirs = np.stack([sess.run(None, {loaded.input_name: x})[0] for x in xs])
  np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5 * np.abs(theirs).max())


@needs_shared
def test_mnist_network_matches_onnxruntime_inside_the_property_boxes():
  path = SHARED / "mnistfc" / "mnist-net_256x2.onnx"
  loaded = load_onnx(path)
  assert loaded.output_shape == (1, 10)
  rng = np.random.default_rng(1)
  props = sorted((SHARED / "mnistfc").glob("*.vnnlib"))[::4]
  xs = np.concatenate([_points_in(read_vnnlib(p), 2, rng) for p in props])
  xs = xs.reshape((-1,) + loaded.input_shape)
  ours = np.asarray(jax.jit(jax.vmap(loaded.apply_fn, in_axes=(None, 0)))(loaded.params, xs))
  sess = _ort_session(path)
  theirs = np.stack([sess.run(None, {loaded.input_name: x})[0] for x in xs])
  np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5 * np.abs(theirs).max())


@needs_shared
def test_flat_and_batched_forms_and_crown_over_a_batch_of_boxes():
  loaded = load_onnx(SHARED / "mnistfc" / "mnist-net_256x2.onnx")
  assert loaded.n_inputs == 784 and loaded.n_outputs == 10
  prop = read_vnnlib(SHARED / "mnistfc" / "prop_0_0.03.vnnlib")
  (region,) = prop.regions
  xs = _points_in(prop, 3, np.random.default_rng(3))
  flat = jax.vmap(loaded.apply_flat, in_axes=(None, 0))(loaded.params, xs)
  batched = loaded.batched(loaded.params, xs.reshape((-1,) + loaded.input_shape))
  assert flat.shape == (5, 10) and batched.shape == (5, 1, 10)
  np.testing.assert_allclose(flat, batched.reshape(5, 10), rtol=1e-6)
  one = region.interval(loaded.input_shape)
  boxes = bj.Interval(jnp.stack([one.lower, one.lower + 0.001]), jnp.stack([one.upper,
                                                                            one.upper + 0.001]))
  out = bj.crown(loaded.batched, intermediate="ibp")(loaded.params, boxes)
  assert out.lower.shape == (2, 1, 10)
  assert enclosed(bj.Interval(out.lower[0, 0], out.upper[0, 0]), flat)


@needs_shared
def test_float64_replay():
  path = SHARED / "acasxu" / "ACASXU_run2a_1_1_batch_2000.onnx"
  loaded = load_onnx(path)
  x = np.array([0.62, -0.2, 0.1, 0.47, -0.48]).reshape(loaded.input_shape)
  y64 = loaded.run_float64(x)
  assert y64.dtype == np.float64 and y64.shape == (1, 5)
  y32 = _ort_session(path).run(None, {loaded.input_name: x.astype(np.float32)})[0]
  np.testing.assert_allclose(y64, y32, rtol=1e-5, atol=1e-6)
  assert loaded(x.astype(np.float32)).dtype == jnp.float32  # x64 mode was for that call only


@needs_shared
def test_crown_on_acasxu_property_1_encloses_samples():
  loaded = load_onnx(SHARED / "acasxu" / "ACASXU_run2a_1_1_batch_2000.onnx")
  prop = read_vnnlib(SHARED / "acasxu" / "prop_1.vnnlib", n_inputs=5, n_outputs=5)
  (region,) = prop.regions
  shape = loaded.input_shape
  box = region.interval(shape)
  xs = _points_in(prop, 10_000, np.random.default_rng(2)).reshape((-1,) + shape)
  ys = jax.jit(jax.vmap(loaded.apply_fn, in_axes=(None, 0)))(loaded.params, xs)
  assert enclosed(bj.ibp(loaded.apply_fn)(loaded.params, box), ys)
  (dj,) = region.disjuncts
  # spec: CROWN of C y (intermediate bounds by IBP keep the compile time of this test low)
  spec_out = bj.crown(loaded.apply_fn, batch_axis=None, spec=crown_spec(dj),
                      intermediate="ibp")(loaded.params, box)
  assert spec_out.lower.shape == (1,)
  rows = unsafe_rows_lower(dj, spec_out.lower)
  true_rows = np.asarray(ys, np.float64).reshape(len(xs), -1) @ dj.C.T - dj.d
  assert np.all(true_rows >= rows - 1e-4)


# ----------------------------------------------------------------------------------------------
# Round trip of Flax models through jax2onnx (optional: jax2onnx is not a dependency, since its
# pins would change the environment; the test runs where it is importable)
# ----------------------------------------------------------------------------------------------

def test_flax_models_round_trip_through_jax2onnx():
  jax2onnx = pytest.importorskip("jax2onnx", reason="jax2onnx is not installed (optional)")
  import flax.linen as nn

  class Mlp(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(4)(nn.relu(nn.Dense(16)(x)))

  class ConvNet(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = nn.max_pool(nn.relu(nn.Conv(4, (3, 3))(x)), window_shape=(2, 2), strides=(2, 2))
      return jax.nn.softmax(nn.Dense(3)(x.reshape((x.shape[0], -1))))

  for module, shape in ((Mlp(), (1, 8)), (ConvNet(), (1, 6, 6, 2))):
    variables = module.init(jax.random.PRNGKey(0), jnp.zeros(shape))
    fn = lambda x, module=module, variables=variables: module.apply(variables, x)  # noqa: E731
    loaded = load_onnx(jax2onnx.to_onnx(fn, [shape]))
    x = rand(*shape)
    np.testing.assert_allclose(loaded(x), fn(x), rtol=1e-5, atol=1e-6)
