"""Load an ONNX network as a pure JAX function: ``apply_fn(params, x)``.

    model = bj.io.load_onnx("net.onnx")
    y = model.apply_fn(model.params, x)             # x of shape model.input_shape
    apply_fn, params = model                        # unpacks like a (fn, params) pair
    box = bj.Interval(lo, hi)                       # lo, hi of shape model.input_shape
    out = bj.crown(model.apply_fn, batch_axis=None)(model.params, box)

What the function is. ``apply_fn`` runs the graph's nodes in order, each through its converter
(`CONVERTERS`, one function per ONNX operator, with the operator's semantics in its docstring),
on plain ``jnp``/``lax`` operations: it jits, vmaps, differentiates, and ``bj.ibp`` /
``bj.crown`` / anything else that traces JAX functions sees ordinary primitives (``dot_general``,
``conv_general_dilated``, ``max`` with 0 for ReLU, ``reduce_window_max`` for max pooling, the
tight `boundjax.nn.softmax`).

Params and constants. ``params`` is a dict ``initializer name -> jnp array`` of the graph's
floating-point initializers (weights, biases, batch-norm statistics): the leaves of the pytree,
so they can be replaced, perturbed or bounded like any Flax parameters. Integer initializers,
initializers feeding an input that must be static (a Reshape's shape, a Slice's starts, a Pad's
pads, ...) and ``Constant`` nodes are constants of the function. Every node whose inputs are all
constants, and every ``Shape``/``Size`` (the shapes are static), is evaluated once at load time
(constant folding, in 64-bit so int64 shape arithmetic is exact): a subgraph such as
``Shape -> Gather -> Unsqueeze -> Concat -> Reshape`` leaves only the Reshape, with a static
target shape, in ``apply_fn``.

Shapes and batches. JAX shapes are static, so the graph runs on the model's input shape
(``model.input_shape``). VNN-COMP networks and PyTorch exports have a fixed batch dimension of 1
(ACAS Xu ``(1, 1, 1, 5)``, MNIST ``(1, 784)`` or ``(1, 1, 28, 28)``); a symbolic dimension
(``"N"``, or 0) is fixed at load time by ``load_onnx(path, input_shape=...)``, else set to 1.
When the first dimension is 1, ``apply_fn`` also takes a batch in its place, ``(B, 1, 28, 28)``
for ``(1, 1, 28, 28)``: the graph runs on each ``x[i:i+1]`` (a vmap, so graphs that hard-code the
batch of 1 stay right) and every output whose first dimension is 1 gets ``B`` there::

    ys = model.apply_fn(model.params, xs)          # xs: (B, 1, 28, 28) -> ys: (B, 10)
    ys = model.batched(model.params, xs5)          # xs5: (B, 1, 1, 28, 28) -> (B, 1, 10)

(``model.batched`` is ``jax.vmap(apply_fn, in_axes=(None, 0))``, for inputs ``(B,
*input_shape)`` whatever the first dimension.) For bounds, give one box of ``input_shape`` with
``bj.crown(model.apply_fn, batch_axis=None)`` (the model's own batch axis of 1 is then just a
dimension), a batch of boxes ``(B, 1, 28, 28)`` to ``bj.crown(model.apply_fn)``, or ``(B,
*input_shape)`` to ``bj.crown(model.batched)``.
``model.apply_flat(params, x)`` takes and returns flat vectors, numbered as in VNNLIB files
(``X_i``, ``Y_j``: row-major order of the input and output tensors). ``model.run_float64(x)``
replays an input in float64 (for checking counterexamples).

Errors. An operator without a converter raises `UnsupportedOperatorError` (a
``NotImplementedError`` and a ``ValueError``) naming the operator, the node and the file; a node
the converter cannot handle (an unsupported attribute value, a dynamic value where a static one
is needed) raises `OnnxImportError` (a ``ValueError``) with the same context. Control flow
(``If``, ``Loop``, ``Scan``) and operators of custom domains are not supported. Each node's
converter runs in a JAX name scope naming the node, so a bound domain (``bj.ibp``, ``bj.crown``)
that cannot bound one of its operations names the ONNX operator and node in its error
(``... in ONNX Xor node 'the_xor'``).

PyTorch. Both exporters of torch 2.13 are covered (``tests/data/``): the default one
(``torch.export`` based, opset 18-20: ``LayerNormalization``, ``Gelu``, ``HardSwish``,
``HardSigmoid``, BatchNorm folded into convolutions) and ``dynamo=False`` (TorchScript based:
GELU as ``Erf``/``Tanh`` arithmetic, ``Expand``, ``Where``, ``Gather`` with constant indices).

Operator semantics follow the ONNX operator specification (opset 7-21, https://onnx.ai/onnx/
operators/); where an operator changed between opsets (inputs that used to be attributes, default
axes), the converter reads the node's opset (``node.opset``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import onnx
from onnx import helper as onnx_helper
from onnx import numpy_helper

from boundjax import nn as bj_nn
from boundjax.core.ir import ONNX_SCOPE

__all__ = ["OnnxModel", "OnnxFunction", "load_onnx", "CONVERTERS", "OnnxImportError",
           "UnsupportedOperatorError", "Node"]


class OnnxImportError(ValueError):
  """An ONNX model that cannot be converted to a JAX function (structure, attribute values, a
  dynamic value where the converter needs a static one). The message names the node and file."""


class UnsupportedOperatorError(OnnxImportError, NotImplementedError):
  """An ONNX operator (or operator domain) that has no converter in `CONVERTERS`."""


# ----------------------------------------------------------------------------------------------
# Nodes
# ----------------------------------------------------------------------------------------------

def _attribute_value(attr: onnx.AttributeProto) -> Any:
  value = onnx_helper.get_attribute_value(attr)
  if isinstance(value, bytes):
    return value.decode()
  if isinstance(value, onnx.TensorProto):
    return numpy_helper.to_array(value)
  if isinstance(value, list) and value and isinstance(value[0], bytes):
    return [v.decode() for v in value]
  return value


@dataclasses.dataclass(frozen=True)
class Node:
  """One ONNX node as a converter sees it: operator, attributes, opset and where it is."""
  op_type: str
  name: str
  inputs: tuple[str, ...]
  outputs: tuple[str, ...]
  attrs: dict[str, Any]
  opset: int
  index: int
  path: str

  @classmethod
  def from_proto(cls, proto: onnx.NodeProto, index: int, opset: int, path: str) -> "Node":
    attrs = {a.name: _attribute_value(a) for a in proto.attribute}
    return cls(proto.op_type, proto.name, tuple(proto.input), tuple(proto.output), attrs, opset,
               index, path)

  def label(self) -> str:
    """``<op> node '<name>'`` (or ``#<index>`` for an unnamed node), e.g. ``Gelu node 'gelu_1'``."""
    name = repr(self.name) if self.name else f"#{self.index} (unnamed, outputs {list(self.outputs)})"
    return f"{self.op_type} node {name}"

  def where(self) -> str:
    return f"{self.label()} of {self.path}"

  def error(self, message: str) -> OnnxImportError:
    return OnnxImportError(f"{self.where()}: {message}")

  def attr(self, key: str, default: Any = None) -> Any:
    return self.attrs.get(key, default)

  def ints(self, key: str, default: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in self.attrs.get(key, default))

  def static(self, value: Any, what: str) -> np.ndarray:
    """``value`` as a NumPy array known at load time, or a clear error if it depends on the
    network's input (shapes, axes, indices and pads must be static in JAX)."""
    if isinstance(value, np.ndarray):
      return value
    if isinstance(value, np.generic):
      return np.asarray(value)
    raise self.error(f"its {what} must be a constant (known when the model is loaded), but it is "
                     "computed from the network's input")


Converter = Callable[..., Any]
"""``converter(node, *inputs) -> output`` (or a tuple of outputs); an omitted optional input is
None. Inputs are NumPy arrays (constants) or JAX arrays/tracers."""

CONVERTERS: dict[str, Converter] = {}
"""ONNX operator type -> its converter. A converter may carry ``static_inputs``: positions of
inputs that must be known at load time (an initializer there is a constant, not a param)."""


def converter(*op_types: str, static_inputs: tuple[int, ...] = ()) -> Callable[[Converter], Converter]:
  """Registers a converter for ``op_types``."""
  def register(fn: Converter) -> Converter:
    fn.static_inputs = static_inputs  # type: ignore[attr-defined]
    for op in op_types:
      CONVERTERS[op] = fn
    return fn
  return register


# ----------------------------------------------------------------------------------------------
# Helpers shared by several converters
# ----------------------------------------------------------------------------------------------

def _axis(axis: int, ndim: int) -> int:
  return axis + ndim if axis < 0 else axis


def _is_static(v: Any) -> bool:
  return isinstance(v, (np.ndarray, np.generic))


def _np_dtype(onnx_type: int) -> np.dtype:
  return np.dtype(onnx_helper.tensor_dtype_to_np_dtype(onnx_type))


def _spatial_pads(node: Node, in_sizes: Sequence[int], kernel: Sequence[int],
                  strides: Sequence[int], dilations: Sequence[int]) -> list[tuple[int, int]]:
  """(begin, end) padding of each spatial axis from ``pads`` / ``auto_pad`` (Conv, pooling).

  ``pads`` is ``[x1_begin, x2_begin, ..., x1_end, x2_end, ...]``. ``SAME_UPPER``/``SAME_LOWER``:
  output size ``ceil(in / stride)``, the total padding split in two with the odd one at the end
  (UPPER) or the beginning (LOWER); ``VALID``: none.
  """
  n = len(in_sizes)
  auto_pad = node.attr("auto_pad", "NOTSET")
  if auto_pad in ("NOTSET", ""):
    pads = node.ints("pads", (0,) * 2 * n)
    return list(zip(pads[:n], pads[n:]))
  if auto_pad == "VALID":
    return [(0, 0)] * n
  if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
    out = []
    for size, k, s, d in zip(in_sizes, kernel, strides, dilations):
      total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
      small, big = total // 2, total - total // 2
      out.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
    return out
  raise node.error(f"auto_pad={auto_pad!r} is not supported")


def _pool_geometry(node: Node, x_shape: Sequence[int]):
  """Kernel, strides, dilations, explicit pads and the extra end padding ``ceil_mode`` adds."""
  kernel = node.ints("kernel_shape", ())
  n = len(kernel)
  if n != len(x_shape) - 2:
    raise node.error(f"kernel_shape {kernel} does not match an input of shape {tuple(x_shape)}")
  strides = node.ints("strides", (1,) * n)
  dilations = node.ints("dilations", (1,) * n)
  pads = _spatial_pads(node, x_shape[2:], kernel, strides, dilations)
  extra = []
  for size, k, s, d, (lo, hi) in zip(x_shape[2:], kernel, strides, dilations, pads):
    span = (k - 1) * d + 1
    if node.attr("ceil_mode", 0):
      out = -(-(size + lo + hi - span) // s) + 1
      if (out - 1) * s >= size + lo:  # the last window must start inside the input or left pad
        out -= 1
    else:
      out = (size + lo + hi - span) // s + 1
    extra.append(max((out - 1) * s + span - (size + lo + hi), 0))
  return kernel, strides, dilations, pads, extra


def _window_sums_np(a: np.ndarray, kernel, strides, dilations) -> np.ndarray:
  """Sums of a NumPy array over strided, dilated windows (no padding)."""
  spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
  win = np.lib.stride_tricks.sliding_window_view(a, spans)
  n = len(kernel)
  win = win[(slice(None),) * n + tuple(slice(None, None, d) for d in dilations)]
  win = win[tuple(slice(None, None, s) for s in strides)]
  return win.sum(axis=tuple(range(n, 2 * n)))


# ----------------------------------------------------------------------------------------------
# Converters: linear algebra
# ----------------------------------------------------------------------------------------------

@converter("Gemm")
def _gemm(node: Node, a, b, c=None):
  """Gemm (opset 11/13): ``Y = alpha * A' @ B' + beta * C`` with ``A' = A.T`` if ``transA``,
  ``B' = B.T`` if ``transB``; ``C`` optional, broadcast to (M, N)."""
  if node.attr("transA", 0):
    a = jnp.transpose(a)
  if node.attr("transB", 0):
    b = jnp.transpose(b)
  y = jnp.matmul(a, b)
  alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
  if alpha != 1.0:
    y = alpha * y
  if c is not None:
    y = y + (c if beta == 1.0 else beta * c)
  return y


@converter("MatMul")
def _matmul(node: Node, a, b):
  """MatMul (opset 13): ``numpy.matmul`` semantics (batched, 1-D operands promoted)."""
  return jnp.matmul(a, b)


# ----------------------------------------------------------------------------------------------
# Converters: element-wise arithmetic (multidirectional, i.e. NumPy, broadcasting)
# ----------------------------------------------------------------------------------------------

# Element-wise operators of two inputs with NumPy broadcasting, opset 14 semantics.
BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "Add": jnp.add,                                # A + B
    "Sub": jnp.subtract,                           # A - B
    "Mul": jnp.multiply,                           # A * B
}


@converter(*BINARY)
def _binary(node: Node, a, b):
  """The operators of `BINARY`."""
  return BINARY[node.op_type](a, b)


@converter("Div")
def _div(node: Node, a, b):
  """Div (opset 14): ``A / B``; integer division truncates toward zero (as onnxruntime)."""
  if jnp.issubdtype(jnp.result_type(a), jnp.integer) and \
      jnp.issubdtype(jnp.result_type(b), jnp.integer):
    a, b = jnp.broadcast_arrays(a, b)
    return lax.div(a, b.astype(a.dtype))
  return jnp.divide(a, b)


# Element-wise operators of one input, opset 13 semantics (Relu: opset 14; Softplus: opset 1).
ELEMENTWISE: dict[str, Callable[[Any], Any]] = {
    "Neg": jnp.negative,                           # -X
    "Abs": jnp.abs,                                # |X|
    "Sqrt": jnp.sqrt,
    "Exp": jnp.exp,
    "Log": jnp.log,                                # natural logarithm
    "Reciprocal": lambda x: 1.0 / x,
    "Floor": jnp.floor,
    "Ceil": jnp.ceil,
    "Erf": lambda x: lax.erf(jnp.asarray(x)),      # lax.erf needs an array, not NumPy
    "Relu": lambda x: jnp.maximum(x, 0),           # max(X, 0)
    "Sigmoid": jax.nn.sigmoid,                     # 1 / (1 + exp(-X))
    "Tanh": jnp.tanh,
    "Softplus": jax.nn.softplus,                   # log(1 + exp(X))
}


@converter(*ELEMENTWISE)
def _elementwise(node: Node, x):
  """The operators of `ELEMENTWISE`: one function applied entry by entry."""
  return ELEMENTWISE[node.op_type](x)


@converter("Pow")
def _pow(node: Node, x, y):
  """Pow (opset 15): ``X ** Y``; a constant integral exponent becomes ``integer_pow``."""
  if _is_static(y) and y.size == 1 and float(y) == int(float(y)) and abs(float(y)) <= 16:
    return lax.integer_pow(jnp.asarray(x), int(float(y)))
  return jnp.power(x, y)


@converter("Max", "Min", "Sum", "Mean")
def _variadic(node: Node, *xs):
  """Max / Min / Sum / Mean (opset 13): element-wise over any number of broadcast inputs."""
  out = xs[0]
  op = {"Max": jnp.maximum, "Min": jnp.minimum, "Sum": jnp.add, "Mean": jnp.add}[node.op_type]
  for x in xs[1:]:
    out = op(out, x)
  return out / len(xs) if node.op_type == "Mean" else out


# ----------------------------------------------------------------------------------------------
# Converters: activations
# ----------------------------------------------------------------------------------------------

@converter("LeakyRelu")
def _leaky_relu(node: Node, x):
  """LeakyRelu (opset 16): ``X if X >= 0 else alpha * X``, ``alpha`` default 0.01."""
  return jax.nn.leaky_relu(x, negative_slope=node.attr("alpha", 0.01))


def _softmax_like(node: Node, x, fn):
  """Softmax-style normalisation along ``axis``. Opset >= 13: over the one axis (default -1).
  Opset < 13: the input is coerced to 2-D ``(prod(shape[:axis]), prod(shape[axis:]))`` (default
  axis 1), normalised over the second dimension and reshaped back."""
  x = jnp.asarray(x)
  if node.opset >= 13:
    return fn(x, axis=_axis(node.attr("axis", -1), x.ndim))
  axis = _axis(node.attr("axis", 1), x.ndim)
  rows = math.prod(x.shape[:axis])
  return fn(jnp.reshape(x, (rows, -1)), axis=1).reshape(x.shape)


def _hard_sigmoid(x, alpha: float, beta: float):
  """``max(0, min(1, alpha * x + beta))``."""
  return jnp.clip(alpha * jnp.asarray(x) + beta, 0.0, 1.0)


@converter("HardSigmoid")
def _hard_sigmoid_op(node: Node, x):
  """HardSigmoid (opset 6): ``max(0, min(1, alpha * X + beta))``, ``alpha`` default 0.2,
  ``beta`` default 0.5."""
  return _hard_sigmoid(x, node.attr("alpha", 0.2), node.attr("beta", 0.5))


@converter("HardSwish")
def _hard_swish(node: Node, x):
  """HardSwish (opset 14): ``X * HardSigmoid(X)`` with ``alpha = 1/6``, ``beta = 0.5``, i.e.
  ``X * relu6(X + 3) / 6`` (Howard et al., "Searching for MobileNetV3", ICCV 2019, §5.2)."""
  return x * _hard_sigmoid(x, 1.0 / 6.0, 0.5)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@converter("Gelu")
def _gelu(node: Node, x):
  """Gelu (opset 20): ``approximate="none"`` (default): ``0.5 * X * (1 + erf(X / sqrt(2)))``;
  ``approximate="tanh"``: ``0.5 * X * (1 + tanh(sqrt(2 / pi) * (X + 0.044715 * X^3)))``
  (Hendrycks and Gimpel, "Gaussian Error Linear Units (GELUs)", 2016, §2). Written with erf /
  tanh, a product and a cube, so every domain bounds it with its rules for those pieces."""
  x = jnp.asarray(x)
  approximate = node.attr("approximate", "none")
  if approximate == "none":
    inner = lax.erf(x * (1.0 / math.sqrt(2.0)))
  elif approximate == "tanh":
    inner = jnp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * lax.integer_pow(x, 3)))
  else:
    raise node.error(f"approximate={approximate!r} is not supported (ONNX allows none, tanh)")
  return 0.5 * x * (1.0 + inner)


@converter("Softmax")
def _softmax(node: Node, x):
  """Softmax (opset 1-13): ``exp(x_i) / sum_j exp(x_j)``, with boundjax's tight bound rule
  (`boundjax.nn.softmax`)."""
  return _softmax_like(node, x, bj_nn.softmax)


@converter("LogSoftmax")
def _log_softmax(node: Node, x):
  """LogSoftmax (opset 1-13): ``x_i - log sum_j exp(x_j)`` (`boundjax.nn.log_softmax`)."""
  return _softmax_like(node, x, bj_nn.log_softmax)


@converter("Clip", static_inputs=())
def _clip(node: Node, x, lo=None, hi=None):
  """Clip (opset 6-13): ``min(max(X, min), max)``. Opset < 11: ``min``/``max`` attributes
  (default -inf/+inf); opset >= 11: optional inputs."""
  if node.opset < 11:
    lo, hi = node.attr("min"), node.attr("max")
  if lo is not None:
    x = jnp.maximum(x, lo)
  if hi is not None:
    x = jnp.minimum(x, hi)
  return x


# ----------------------------------------------------------------------------------------------
# Converters: convolution, normalisation, pooling (layout N, C, spatial...)
# ----------------------------------------------------------------------------------------------

@converter("Conv")
def _conv(node: Node, x, w, b=None):
  """Conv (opset 11): ``X`` (N, C, D1..Dn), ``W`` (M, C/group, k1..kn), optional bias ``B`` (M);
  attributes ``strides``, ``dilations``, ``pads``/``auto_pad``, ``group``."""
  n = jnp.ndim(x) - 2
  kernel = tuple(jnp.shape(w)[2:])
  strides = node.ints("strides", (1,) * n)
  dilations = node.ints("dilations", (1,) * n)
  pads = _spatial_pads(node, jnp.shape(x)[2:], kernel, strides, dilations)
  y = lax.conv_general_dilated(x, w, window_strides=strides, padding=pads,
                               rhs_dilation=dilations,
                               feature_group_count=int(node.attr("group", 1)))
  if b is not None:
    y = y + jnp.reshape(b, (-1,) + (1,) * n)
  return y


@converter("ConvTranspose")
def _conv_transpose(node: Node, x, w, b=None):
  """ConvTranspose (opset 11): the gradient of Conv. ``X`` (N, C, D1..Dn), ``W``
  (C, M/group, k1..kn); output size ``stride * (in - 1) + output_padding + (k - 1) * dilation +
  1 - pad_begin - pad_end``. Computed as a convolution of the input dilated by ``strides`` with
  the spatially flipped, in/out-swapped kernel. ``output_shape`` and ``auto_pad`` are not
  supported."""
  if node.attr("output_shape") is not None or node.attr("auto_pad", "NOTSET") not in ("NOTSET", ""):
    raise node.error("ConvTranspose with output_shape or auto_pad is not supported; give pads")
  n = jnp.ndim(x) - 2
  c_in, m_per_group = jnp.shape(w)[:2]
  kernel = tuple(jnp.shape(w)[2:])
  group = int(node.attr("group", 1))
  strides = node.ints("strides", (1,) * n)
  dilations = node.ints("dilations", (1,) * n)
  pads = node.ints("pads", (0,) * 2 * n)
  out_pad = node.ints("output_padding", (0,) * n)
  w = jnp.reshape(w, (group, c_in // group, m_per_group) + kernel)
  w = jnp.swapaxes(w, 1, 2).reshape((group * m_per_group, c_in // group) + kernel)
  w = jnp.flip(w, axis=tuple(range(2, 2 + n)))
  padding = [((k - 1) * d - lo, (k - 1) * d - hi + op)
             for k, d, lo, hi, op in zip(kernel, dilations, pads[:n], pads[n:], out_pad)]
  y = lax.conv_general_dilated(x, w, window_strides=(1,) * n, padding=padding,
                               lhs_dilation=strides, rhs_dilation=dilations,
                               feature_group_count=group)
  if b is not None:
    y = y + jnp.reshape(b, (-1,) + (1,) * n)
  return y


@converter("BatchNormalization")
def _batch_norm(node: Node, x, scale, bias, mean, var):
  """BatchNormalization (opset 15), inference mode: ``Y = (X - mean) / sqrt(var + epsilon) *
  scale + B`` per channel (axis 1). ``training_mode=1`` is not supported."""
  if node.attr("training_mode", 0) or sum(1 for o in node.outputs if o) > 1:
    raise node.error("training mode (running statistics as outputs) is not supported")
  shape = (-1,) + (1,) * (jnp.ndim(x) - 2)
  factor = scale / jnp.sqrt(var + node.attr("epsilon", 1e-5))
  return (x - jnp.reshape(mean, shape)) * jnp.reshape(factor, shape) + jnp.reshape(bias, shape)


@converter("LayerNormalization")
def _layer_norm(node: Node, x, scale, bias=None):
  """LayerNormalization (opset 17): over the axes ``axis..rank-1`` (``axis`` default -1),
  ``D = X - mean(X)``, ``Y = D / sqrt(mean(D^2) + epsilon) * Scale + B`` (``epsilon`` default
  1e-5; ``Scale``, ``B`` broadcast to the normalised axes). The optional outputs are ``Mean`` and
  ``InvStdDev = 1 / sqrt(mean(D^2) + epsilon)`` with the normalised axes kept as size 1.
  ``stash_type`` (the precision of the statistics) is ignored: they are computed in the input's
  type (Ba, Kiros and Hinton, "Layer Normalization", 2016, §3)."""
  x = jnp.asarray(x)
  axes = tuple(range(_axis(node.attr("axis", -1), x.ndim), x.ndim))
  mean = jnp.mean(x, axis=axes, keepdims=True)
  d = x - mean
  inv_std = lax.rsqrt(jnp.mean(jnp.square(d), axis=axes, keepdims=True) +
                      np.asarray(node.attr("epsilon", 1e-5), x.dtype))
  y = d * inv_std * scale
  if bias is not None:
    y = y + bias
  if len(node.outputs) > 1:
    return y, mean, inv_std
  return y


@converter("MaxPool")
def _max_pool(node: Node, x):
  """MaxPool (opset 12): the maximum over each window (``kernel_shape``, ``strides``,
  ``dilations``, ``pads``/``auto_pad``, ``ceil_mode``); padding never wins (-inf). The
  ``Indices`` output and ``storage_order`` are not supported."""
  if len([o for o in node.outputs if o]) > 1:
    raise node.error("the Indices output is not supported")
  kernel, strides, dilations, pads, extra = _pool_geometry(node, jnp.shape(x))
  padding = [(0, 0), (0, 0)] + [(lo, hi + e) for (lo, hi), e in zip(pads, extra)]
  dtype = jnp.result_type(x)
  init = -np.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min
  # a NumPy init value: lax recognises (max, -inf) and binds reduce_window_max
  return lax.reduce_window(x, np.array(init, dtype), lax.max,
                           (1, 1) + kernel, (1, 1) + strides, padding,
                           window_dilation=(1, 1) + dilations)


@converter("AveragePool")
def _average_pool(node: Node, x):
  """AveragePool (opset 19): the mean over each window. ``count_include_pad=0`` (default) divides
  by the number of input entries in the window, ``1`` also counts the explicit padding (not the
  extra end padding of ``ceil_mode``)."""
  kernel, strides, dilations, pads, extra = _pool_geometry(node, jnp.shape(x))
  padding = [(0, 0), (0, 0)] + [(lo, hi + e) for (lo, hi), e in zip(pads, extra)]
  sums = lax.reduce_window(x, np.array(0, jnp.result_type(x)), lax.add,
                           (1, 1) + kernel, (1, 1) + strides, padding,
                           window_dilation=(1, 1) + dilations)
  include = float(node.attr("count_include_pad", 0))
  ones = np.pad(np.ones(jnp.shape(x)[2:]), pads, constant_values=include)
  ones = np.pad(ones, [(0, e) for e in extra])
  counts = _window_sums_np(ones, kernel, strides, dilations).astype(jnp.result_type(x))
  return sums / counts


@converter("GlobalAveragePool")
def _global_average_pool(node: Node, x):
  """GlobalAveragePool (opset 1): the mean over all spatial axes, kept as size-1 axes."""
  return jnp.mean(x, axis=tuple(range(2, jnp.ndim(x))), keepdims=True)


@converter("GlobalMaxPool")
def _global_max_pool(node: Node, x):
  """GlobalMaxPool (opset 1): the maximum over all spatial axes, kept as size-1 axes."""
  return jnp.max(x, axis=tuple(range(2, jnp.ndim(x))), keepdims=True)


# ----------------------------------------------------------------------------------------------
# Converters: reductions
# ----------------------------------------------------------------------------------------------

@converter("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", static_inputs=(1,))
def _reduce(node: Node, x, axes=None):
  """ReduceSum / ReduceMean / ReduceMax / ReduceMin (opset 1-18): ``axes`` an attribute (before
  opset 13 for ReduceSum, 18 for the others) or an optional input; none means all axes unless
  ``noop_with_empty_axes``; ``keepdims`` default 1."""
  if axes is None:
    axes = node.attr("axes")
  else:
    axes = node.static(axes, "axes").tolist()
  if not axes:
    if node.attr("noop_with_empty_axes", 0):
      return x
    axes = list(range(jnp.ndim(x)))
  axes = tuple(_axis(int(a), jnp.ndim(x)) for a in axes)
  fn = {"ReduceSum": jnp.sum, "ReduceMean": jnp.mean, "ReduceMax": jnp.max,
        "ReduceMin": jnp.min}[node.op_type]
  return fn(x, axis=axes, keepdims=bool(node.attr("keepdims", 1)))


# ----------------------------------------------------------------------------------------------
# Converters: shapes and data movement
# ----------------------------------------------------------------------------------------------

@converter("Flatten")
def _flatten(node: Node, x):
  """Flatten (opset 13): reshape to 2-D ``(prod(shape[:axis]), prod(shape[axis:]))``, axis
  default 1 (negative counts from the end)."""
  shape = jnp.shape(x)
  axis = _axis(node.attr("axis", 1), len(shape))
  return jnp.reshape(x, (math.prod(shape[:axis]), math.prod(shape[axis:])))


@converter("Reshape", static_inputs=(1,))
def _reshape(node: Node, x, shape):
  """Reshape (opset 14): to the static ``shape``; a 0 copies the input's dimension (unless
  ``allowzero=1``), one -1 is inferred."""
  target = [int(s) for s in node.static(shape, "target shape").reshape(-1)]
  if not node.attr("allowzero", 0):
    target = [jnp.shape(x)[i] if s == 0 else s for i, s in enumerate(target)]
  return jnp.reshape(x, target)


@converter("Transpose")
def _transpose(node: Node, x):
  """Transpose (opset 13): permute axes by ``perm`` (default: reversed)."""
  perm = node.attr("perm")
  return jnp.transpose(x, None if perm is None else tuple(int(p) for p in perm))


def _axes_input_or_attr(node: Node, axes, since: int) -> list[int] | None:
  """``axes`` given as an attribute before opset ``since`` and as an input from it on."""
  if node.opset < since:
    value = node.attr("axes")
    return None if value is None else [int(a) for a in value]
  return None if axes is None else [int(a) for a in node.static(axes, "axes").reshape(-1)]


@converter("Squeeze", static_inputs=(1,))
def _squeeze(node: Node, x, axes=None):
  """Squeeze (opset 1-13): remove the size-1 ``axes`` (all size-1 axes if none given)."""
  axes = _axes_input_or_attr(node, axes, 13)
  if axes is None:
    axes = [i for i, s in enumerate(jnp.shape(x)) if s == 1]
  return jnp.squeeze(x, axis=tuple(_axis(a, jnp.ndim(x)) for a in axes))


@converter("Unsqueeze", static_inputs=(1,))
def _unsqueeze(node: Node, x, axes=None):
  """Unsqueeze (opset 1-13): insert size-1 axes at ``axes`` (positions in the output)."""
  axes = _axes_input_or_attr(node, axes, 13)
  out_rank = jnp.ndim(x) + len(axes)
  axes = sorted(_axis(a, out_rank) for a in axes)
  if _is_static(x):
    return np.expand_dims(x, tuple(axes))
  return jnp.expand_dims(x, tuple(axes))


@converter("Concat")
def _concat(node: Node, *xs):
  """Concat (opset 13): join along ``axis`` (negative counts from the end)."""
  xs = [x for x in xs if x is not None]
  return jnp.concatenate(xs, axis=_axis(int(node.attr("axis")), jnp.ndim(xs[0])))


@converter("Split", static_inputs=(1,))
def _split(node: Node, x, split=None):
  """Split (opset 2-18): into the sizes ``split`` (attribute before opset 13, input from it on)
  along ``axis``, or into equal parts (``num_outputs``, or one per output)."""
  axis = _axis(node.attr("axis", 0), jnp.ndim(x))
  if node.opset < 13:
    split = node.attr("split")
  elif split is not None:
    split = node.static(split, "split").tolist()
  n_out = len(node.outputs)
  if not split:
    size = jnp.shape(x)[axis]
    part = -(-size // n_out)
    split = [min(part, size - i * part) for i in range(n_out)]
  bounds = np.cumsum(split)[:-1].tolist()
  return tuple(jnp.split(x, bounds, axis=axis))


def _slice_range(start: int, end: int, step: int, dim: int) -> slice:
  """ONNX Slice clamping: negative indices count from the end; then start, end are clamped to
  [0, dim] (positive step) or start to [0, dim-1] and end to [-1, dim-1] (negative step)."""
  start = start + dim if start < 0 else start
  end = end + dim if end < 0 else end
  if step > 0:
    return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
  start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
  return slice(start, None if end < 0 else end, step)


@converter("Slice", static_inputs=(1, 2, 3, 4))
def _slice(node: Node, x, starts=None, ends=None, axes=None, steps=None):
  """Slice (opset 1-13): ``x[starts:ends:steps]`` along ``axes`` (default all leading axes);
  attributes before opset 10, static inputs from it on."""
  if node.opset < 10:
    starts, ends, axes = node.attr("starts"), node.attr("ends"), node.attr("axes")
    steps = None
  else:
    starts = node.static(starts, "starts").tolist()
    ends = node.static(ends, "ends").tolist()
    axes = None if axes is None else node.static(axes, "axes").tolist()
    steps = None if steps is None else node.static(steps, "steps").tolist()
  shape = jnp.shape(x)
  axes = list(range(len(starts))) if axes is None else [_axis(int(a), len(shape)) for a in axes]
  steps = [1] * len(starts) if steps is None else steps
  index = [slice(None)] * len(shape)
  for a, s, e, st in zip(axes, starts, ends, steps):
    index[a] = _slice_range(int(s), int(e), int(st), shape[a])
  return x[tuple(index)]


@converter("Gather")
def _gather(node: Node, x, indices):
  """Gather (opset 13): ``take(data, indices, axis)`` (axis default 0, negative indices count
  from the end); the output has the indices' shape in place of ``axis``."""
  axis = _axis(node.attr("axis", 0), jnp.ndim(x))
  dim = jnp.shape(x)[axis]
  if _is_static(indices):
    indices = np.where(indices < 0, indices + dim, indices)
    if _is_static(x):
      return np.take(x, indices, axis=axis)
  else:
    indices = jnp.where(indices < 0, indices + dim, indices)
  return jnp.take(x, indices, axis=axis, mode="clip")


@converter("Pad", static_inputs=(1, 3))
def _pad(node: Node, x, pads=None, value=None, axes=None):
  """Pad (opset 2-19): ``pads = [x1_begin, x2_begin, ..., x1_end, x2_end, ...]`` over ``axes``
  (default all; negative pads crop); ``mode`` constant (with ``constant_value``, default 0),
  reflect, edge or wrap. Attributes ``pads``/``value`` before opset 11."""
  if node.opset < 11:
    pads, value = node.attr("pads"), node.attr("value", 0.0)
  else:
    pads = node.static(pads, "pads").tolist()
  ndim = jnp.ndim(x)
  axes = list(range(ndim)) if axes is None else \
      [_axis(int(a), ndim) for a in node.static(axes, "axes").tolist()]
  n = len(axes)
  widths = [(0, 0)] * ndim
  for a, lo, hi in zip(axes, pads[:n], pads[n:]):
    widths[a] = (int(lo), int(hi))
  mode = node.attr("mode", "constant")
  if mode == "constant":
    fill = jnp.asarray(0 if value is None else value, jnp.result_type(x)).reshape(())
    return lax.pad(jnp.asarray(x), fill, [(lo, hi, 0) for lo, hi in widths])
  if mode not in ("reflect", "edge", "wrap"):
    raise node.error(f"mode={mode!r} is not supported")
  crop = tuple(slice(max(-lo, 0), jnp.shape(x)[i] - max(-hi, 0)) for i, (lo, hi) in enumerate(widths))
  return jnp.pad(x[crop], [(max(lo, 0), max(hi, 0)) for lo, hi in widths], mode=mode)


@converter("Expand", static_inputs=(1,))
def _expand(node: Node, x, shape):
  """Expand (opset 13): broadcast to ``shape`` under NumPy's (bidirectional) rule."""
  target = np.broadcast_shapes(jnp.shape(x), tuple(node.static(shape, "shape").tolist()))
  return jnp.broadcast_to(x, target)


@converter("Tile", static_inputs=(1,))
def _tile(node: Node, x, repeats):
  """Tile (opset 13): repeat ``repeats[i]`` times along axis i."""
  return jnp.tile(x, tuple(node.static(repeats, "repeats").tolist()))


# ----------------------------------------------------------------------------------------------
# Converters: constants, casts, shapes (folded at load time)
# ----------------------------------------------------------------------------------------------

@converter("Constant")
def _constant(node: Node):
  """Constant (opset 13): the tensor of the one attribute ``value``, ``value_float(s)`` or
  ``value_int(s)`` (``sparse_value`` and strings are not supported)."""
  for key, dtype in (("value", None), ("value_float", np.float32), ("value_floats", np.float32),
                     ("value_int", np.int64), ("value_ints", np.int64)):
    if key in node.attrs:
      return np.asarray(node.attrs[key], dtype=dtype)
  raise node.error(f"attributes {sorted(node.attrs)} are not supported (need value, "
                   "value_float(s) or value_int(s))")


@converter("ConstantOfShape", static_inputs=(0,))
def _constant_of_shape(node: Node, shape):
  """ConstantOfShape (opset 9): a tensor of static ``shape`` filled with ``value`` (a
  one-element tensor, default float32 0)."""
  value = node.attr("value", np.zeros(1, np.float32))
  return np.full(tuple(node.static(shape, "shape").tolist()), value.reshape(()), value.dtype)


@converter("Identity", "Dropout")
def _identity(node: Node, x, *rest):
  """Identity (opset 16) and Dropout (opset 13, inference: the identity; its optional mask
  output is all true)."""
  if node.op_type == "Dropout" and len([o for o in node.outputs if o]) > 1:
    return x, jnp.ones(jnp.shape(x), bool)
  return x


@converter("Cast")
def _cast(node: Node, x):
  """Cast (opset 13): convert to the element type ``to`` (64-bit types become 32-bit inside
  ``apply_fn`` unless JAX's x64 mode is on)."""
  dtype = _np_dtype(node.attr("to"))
  if dtype.kind not in "biuf":
    raise node.error(f"cast to {dtype} is not supported")
  if _is_static(x):
    return np.asarray(x).astype(dtype)
  return jnp.asarray(x).astype(jax.dtypes.canonicalize_dtype(dtype))


@converter("Shape")
def _shape(node: Node, x):
  """Shape (opset 15): the input's shape as int64, ``shape[start:end]``; always static."""
  shape = jnp.shape(x)
  start, end = node.attr("start", 0), node.attr("end", None)
  return np.asarray(shape[start:end], np.int64)


@converter("Size")
def _size(node: Node, x):
  """Size (opset 13): the number of entries, as an int64 scalar; always static."""
  return np.asarray(math.prod(jnp.shape(x)), np.int64)


@converter("Range")
def _range(node: Node, start, limit, delta):
  """Range (opset 11): ``arange(start, limit, delta)`` (static inputs)."""
  start, limit, delta = (node.static(v, "start/limit/delta") for v in (start, limit, delta))
  return np.arange(start, limit, delta, dtype=np.asarray(start).dtype)


@converter("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")
def _compare(node: Node, a, b):
  """Equal / Less / Greater / LessOrEqual / GreaterOrEqual (opset 13-16): element-wise
  comparisons with NumPy broadcasting (bool output)."""
  fn = {"Equal": jnp.equal, "Less": jnp.less, "Greater": jnp.greater,
        "LessOrEqual": jnp.less_equal, "GreaterOrEqual": jnp.greater_equal}[node.op_type]
  return fn(a, b)


@converter("Not", "And", "Or", "Xor")
def _logical(node: Node, a, b=None):
  """Not / And / Or / Xor (opset 7): element-wise logic on bools."""
  if node.op_type == "Not":
    return jnp.logical_not(a)
  fn = {"And": jnp.logical_and, "Or": jnp.logical_or, "Xor": jnp.logical_xor}[node.op_type]
  return fn(a, b)


@converter("Where")
def _where(node: Node, cond, a, b):
  """Where (opset 16): ``a`` where ``cond`` else ``b``, broadcast."""
  return jnp.where(cond, a, b)


# ----------------------------------------------------------------------------------------------
# The graph
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Graph:
  nodes: list[Node]
  constants: dict[str, np.ndarray]
  input_name: str
  output_names: list[str]
  input_shape: tuple[int, ...]
  path: str


def _convert_node(node: Node, values: list) -> list:
  fn = CONVERTERS.get(node.op_type)
  if fn is None:
    raise UnsupportedOperatorError(
        f"{node.where()}: ONNX operator {node.op_type!r} is not supported by boundjax.io "
        f"(supported: {', '.join(sorted(CONVERTERS))})")
  try:
    out = fn(node, *values)
  except OnnxImportError:
    raise
  except (TypeError, ValueError, IndexError, KeyError, ZeroDivisionError) as e:
    raise node.error(f"conversion failed: {type(e).__name__}: {e}") from e
  outs = list(out) if isinstance(out, tuple) else [out]
  wanted = [o for o in node.outputs if o]
  if len(outs) < len(node.outputs) and len(wanted) > len(outs):
    raise node.error(f"only {len(outs)} of its {len(node.outputs)} outputs are supported")
  return outs


def _run(graph: _Graph, params: dict, x: Any, folded: dict | None = None):
  """Evaluates the graph. With ``folded`` (the load-time pass) every node whose inputs are all
  constants is evaluated eagerly in 64-bit NumPy-exact arithmetic and its outputs recorded there;
  at apply time those nodes are gone."""
  env: dict[str, Any] = dict(graph.constants)
  env.update(params)
  env[graph.input_name] = x
  for node in graph.nodes:
    values = [env[name] if name else None for name in node.inputs]
    missing = [name for name in node.inputs if name and name not in env]
    if missing:
      raise node.error(f"inputs {missing} are not produced by any earlier node")
    if folded is not None and all(v is None or _is_static(v) for v in values):
      with jax.ensure_compile_time_eval(), jax.enable_x64(True):
        outs = [None if o is None else np.asarray(o) for o in _convert_node(node, values)]
    else:
      # the scope names the node in the equations' source info, so a bound domain that cannot
      # handle one of them names the ONNX operator (`boundjax.core.ir.source_line`)
      with jax.named_scope(ONNX_SCOPE + node.label()):
        outs = _convert_node(node, values)
    for name, value in zip(node.outputs, outs):
      if name:
        env[name] = value
        if folded is not None and _is_static(value):
          folded[name] = np.asarray(value)
  outs = tuple(jnp.asarray(env[name]) for name in graph.output_names)
  return outs[0] if len(outs) == 1 else outs


def is_user_batch(own: tuple[int, ...], shape: tuple[int, ...]) -> bool:
  """A batch in place of the file's batch dimension of 1: ``own = (1, *rest)`` and ``shape =
  (B, *rest)`` (``B = 1`` is the model's own shape)."""
  return len(own) >= 1 and own[0] == 1 and len(shape) == len(own) and shape[1:] == own[1:]


def _over_user_batch(graph: _Graph, params: dict, x: Any) -> Any:
  """The graph on each ``x[i:i+1]`` of a batch ``(B, *rest)`` (a ``vmap``, so a graph that
  hard-codes its batch of 1, e.g. ``Reshape(x, [1, -1])``, stays correct). An output whose first
  dimension is 1 (the file's batch dimension) gets ``B`` there, ``(B, *out[1:])``; any other
  output gets a new leading axis, ``(B, *out)``."""
  outs = jax.vmap(lambda xi: _run(graph, params, xi[None]))(x)
  single = not isinstance(outs, tuple)
  outs = (outs,) if single else outs
  outs = tuple(jnp.reshape(o, (o.shape[0], *o.shape[2:])) if o.ndim >= 2 and o.shape[1] == 1
               else o for o in outs)
  return outs[0] if single else outs


def _shape_error(path: str, own: tuple[int, ...], shape: tuple[int, ...], called: str) -> str:
  """Why ``called`` (``"apply_fn"`` or ``"model.batched"``) refuses an input of ``shape``, the
  shapes it takes, and which other function takes ``shape`` (never ``called`` itself)."""
  batch1 = len(own) >= 1 and own[0] == 1
  user = f"(B, {', '.join(map(str, own[1:]))}{',' if len(own) == 2 else ''})" if batch1 else None
  full = f"(B, {', '.join(map(str, own))})"
  if called == "apply_fn":
    takes = f"an input of the model's shape {own}" + (f" or a batch {user}" if batch1 else "")
    hint = ""
    if len(shape) == len(own) + 1 and shape[1:] == own:
      hint = (f" A batch of inputs of the model's full shape {full} is what model.batched takes"
              + (f"; or pass it here as {user}" if batch1 else "") + ".")
    elif len(shape) == len(own) - 1 and batch1 and shape == own[1:]:
      hint = f" For one input, add the batch dimension of 1: x[None] has shape {own}."
  else:
    takes = f"a batch {full}" + (f" or {user}" if batch1 else "")
    hint = ""
    if shape == own:
      hint = " For one input of the model's shape, call model.apply_fn (or model(x))."
  return f"{path}: {called} takes {takes}; got an input of shape {shape}.{hint}"


class _Batched:
  """``model.batched``: ``apply_fn`` over a leading batch axis. ``(B, *input_shape)`` -> each
  output with a leading ``B`` (``jax.vmap(apply_fn, in_axes=(None, 0))``); a batch in place of the
  file's batch dimension of 1, ``(B, *input_shape[1:])``, goes to ``apply_fn`` as is."""

  def __init__(self, fn: "OnnxFunction"):
    self.fn = fn
    self.__name__ = self.__qualname__ = fn.__name__ + "_batched"
    self.__doc__ = self.__class__.__doc__

  def __call__(self, params: dict, x: Any) -> Any:
    shape = tuple(jnp.shape(x))
    own = self.fn.graph.input_shape
    if len(shape) == len(own) + 1 and shape[1:] == own:
      return jax.vmap(lambda xi: _run(self.fn.graph, params, xi))(x)
    if is_user_batch(own, shape):
      return self.fn(params, x)
    raise ValueError(_shape_error(self.fn.graph.path, own, shape, "model.batched"))


class OnnxFunction:
  """The graph as a pure JAX function ``(params, x) -> y`` of an input of the model's own shape
  (a plain picklable object, so a model can be sent to worker processes)."""

  def __init__(self, graph: _Graph):
    self.graph = graph
    stem = os.path.splitext(os.path.basename(graph.path))[0]
    self.__name__ = self.__qualname__ = "onnx_" + re.sub(r"\W", "_", stem)
    self.__doc__ = f"The ONNX graph of {graph.path} as a JAX function (params, x) -> y."

  def __call__(self, params: dict, x: Any) -> Any:
    shape = tuple(jnp.shape(x))
    own = self.graph.input_shape
    if shape == own:
      return _run(self.graph, params, x)
    if is_user_batch(own, shape):
      return _over_user_batch(self.graph, params, x)
    raise ValueError(_shape_error(self.graph.path, own, shape, "apply_fn"))

  def __repr__(self) -> str:
    return f"<{self.__name__}: ONNX graph of {self.graph.path}, input {self.graph.input_shape}>"


@dataclasses.dataclass(frozen=True, eq=False)
class OnnxModel:
  """A loaded ONNX network. ``apply_fn(params, x)`` is the graph as a pure JAX function of an
  input of shape ``input_shape``; unpacks as ``apply_fn, params = model``; ``model(x)`` applies it
  with its own params.

  Attributes:
    apply_fn: ``(params, x) -> y`` (a tuple of outputs if the graph has several).
    params: ``initializer name -> jnp array`` (the floating-point weights).
    input_shape: the static input shape (symbolic dimensions fixed at load time).
    output_shape: the output's shape (a tuple of shapes if the graph has several outputs).
    input_name, output_names: the graph's input and output names.
    input_dtype: the input's element type (float32 for most networks).
    path: the file it was loaded from.
  """
  apply_fn: OnnxFunction
  params: dict[str, jax.Array]
  input_shape: tuple[int, ...]
  output_shape: tuple
  input_name: str
  output_names: tuple[str, ...]
  input_dtype: np.dtype
  path: str

  @property
  def output_name(self) -> str:
    return self.output_names[0]

  @property
  def n_inputs(self) -> int:
    """Entries of one input (VNNLIB's ``X_0 .. X_{n-1}``, row-major)."""
    return math.prod(self.input_shape)

  @property
  def n_outputs(self) -> int:
    """Entries of the (first) output (VNNLIB's ``Y_0 .. Y_{m-1}``, row-major)."""
    shape = self.output_shape if len(self.output_names) == 1 else self.output_shape[0]
    return math.prod(shape)

  def apply_flat(self, params: dict, x: Any) -> Any:
    """``apply_fn`` on flat vectors, as VNNLIB numbers them: ``x`` of shape ``(n_inputs,)`` is
    reshaped (row-major) to ``input_shape``; returns the (first) output flattened,
    ``(n_outputs,)``. Vmap it for batches; ``bj.crown(model.apply_flat, batch_axis=None)`` bounds
    one box of shape ``(n_inputs,)``."""
    y = self.apply_fn(params, jnp.reshape(x, self.input_shape))
    return jnp.reshape(y[0] if isinstance(y, tuple) else y, (-1,))

  @functools.cached_property
  def batched(self) -> Callable[[dict, Any], Any]:
    """``jax.vmap(apply_fn, in_axes=(None, 0))``: inputs ``(B, *input_shape)``, for a batch of
    points or, under ``bj.crown(model.batched)`` / ``bj.ibp``, a batch of boxes. (When the file's
    batch dimension is 1, ``apply_fn`` itself also takes ``(B, *input_shape[1:])``.)"""
    return _Batched(self.apply_fn)

  def __iter__(self) -> Iterator[Any]:
    yield self.apply_fn
    yield self.params

  def __call__(self, x: Any) -> Any:
    return self.apply_fn(self.params, x)

  def run_float64(self, x: Any) -> np.ndarray | tuple[np.ndarray, ...]:
    """The network in float64 (JAX's x64 mode for this call; the float32 weights are exact in
    float64): to replay a counterexample with rounding errors far below float32's."""
    with jax.enable_x64(True):
      params = {k: jnp.asarray(v, jnp.float64) for k, v in self.params.items()}
      y = self.apply_fn(params, jnp.asarray(np.asarray(x, np.float64).reshape(self.input_shape)))
      return tuple(np.asarray(o) for o in y) if isinstance(y, tuple) else np.asarray(y)

  def __getstate__(self) -> dict:
    return {k: v for k, v in self.__dict__.items() if k != "batched"}  # a vmap is not picklable


def _static_initializers(graph_proto: onnx.GraphProto) -> set[str]:
  """Names used at a static input position of some node (those initializers are constants)."""
  names = set()
  for proto in graph_proto.node:
    fn = CONVERTERS.get(proto.op_type)
    for pos in getattr(fn, "static_inputs", ()):
      if pos < len(proto.input) and proto.input[pos]:
        names.add(proto.input[pos])
  return names


def _opset(model: onnx.ModelProto) -> int:
  for entry in model.opset_import:
    if entry.domain in ("", "ai.onnx"):
      return int(entry.version)
  return 1


def load_onnx(path: str | os.PathLike | onnx.ModelProto, *,
              input_shape: Sequence[int] | None = None) -> OnnxModel:
  """Loads an ONNX file as a JAX function (see the module docstring).

  Args:
    path: an ``.onnx`` file (or an in-memory ``onnx.ModelProto``).
    input_shape: the input shape to fix symbolic dimensions (default: the file's shape with every
      symbolic or zero dimension set to 1).

  Returns:
    An `OnnxModel` (unpacks as ``apply_fn, params``).

  Raises:
    UnsupportedOperatorError: an operator without a converter (named, with its node and file).
    OnnxImportError: anything else the converter cannot handle (named, with its node and file).
  """
  if isinstance(path, onnx.ModelProto):
    model, where = path, f"<ModelProto {path.graph.name or 'unnamed'}>"
  else:
    where = os.fspath(path)
    try:
      model = onnx.load(where)
    except Exception as e:  # noqa: BLE001 (protobuf raises several kinds)
      raise OnnxImportError(f"{where}: not a readable ONNX model ({type(e).__name__}: {e})") from e
  g = model.graph
  opset = _opset(model)
  init_names = {t.name for t in g.initializer}
  inputs = [i for i in g.input if i.name not in init_names]
  if len(inputs) != 1:
    raise OnnxImportError(f"{where}: boundjax.io supports graphs with one input, this one has "
                          f"{[i.name for i in inputs]}")
  (inp,) = inputs
  ttype = inp.type.tensor_type
  file_shape = [d.dim_value if d.HasField("dim_value") else 0 for d in ttype.shape.dim]
  if input_shape is None:
    input_shape = tuple(s if s > 0 else 1 for s in file_shape)
  else:
    input_shape = tuple(int(s) for s in input_shape)
    if len(input_shape) != len(file_shape) or any(
        f > 0 and f != s for f, s in zip(file_shape, input_shape)):
      raise OnnxImportError(f"{where}: input_shape {input_shape} does not fit the model's input "
                            f"shape {file_shape} (0 = symbolic)")
  input_dtype = _np_dtype(ttype.elem_type) if ttype.elem_type else np.dtype(np.float32)

  nodes = []
  for i, proto in enumerate(g.node):
    if proto.domain not in ("", "ai.onnx"):
      node = Node.from_proto(proto, i, opset, where)
      raise UnsupportedOperatorError(f"{node.where()}: operator domain {proto.domain!r} is not "
                                     "supported (only the default ONNX domain)")
    nodes.append(Node.from_proto(proto, i, opset, where))

  static_names = _static_initializers(g)
  constants, params = {}, {}
  for t in g.initializer:
    array = numpy_helper.to_array(t)
    if array.dtype.kind == "f" and t.name not in static_names:
      params[t.name] = jnp.asarray(array)
    else:
      constants[t.name] = np.asarray(array)
  graph = _Graph(nodes, constants, inp.name, [o.name for o in g.output], input_shape, where)

  # The load-time pass: folds constant subgraphs, checks every converter, finds output shapes.
  folded: dict[str, np.ndarray] = {}
  x_struct = jax.ShapeDtypeStruct(input_shape, jnp.dtype(input_dtype.name if input_dtype.kind == "f"
                                                          else "float32"))
  p_struct = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in params.items()}
  out_struct = jax.eval_shape(lambda p, x: _run(graph, p, x, folded), p_struct, x_struct)
  graph.constants = {**constants, **folded}
  graph.nodes = [n for n in nodes if not all((not o) or o in folded for o in n.outputs)]
  outs = out_struct if isinstance(out_struct, tuple) else (out_struct,)
  output_shape = tuple(outs[0].shape) if len(outs) == 1 else tuple(tuple(o.shape) for o in outs)

  apply_fn = OnnxFunction(graph)
  return OnnxModel(apply_fn=apply_fn, params=params, input_shape=input_shape,
                   output_shape=output_shape, input_name=inp.name,
                   output_names=tuple(o.name for o in g.output), input_dtype=input_dtype,
                   path=where)
