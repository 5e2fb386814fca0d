"""Networks as chains of affine layers with ReLU between them, in float64 (MILP-facing).

A `Network` is ``x -> A_1 -> ReLU -> A_2 -> ReLU -> ... -> A_L`` where every affine map
``A_m(h) = W_m h + b_m`` may have interval parameters ``W_m in [W_lo, W_hi]``,
``b_m in [b_lo, b_hi]`` (a hyper-network, Sphynx, §4). A concrete network is the special
case ``W_lo == W_hi``. Inputs are flattened in row-major order (NHWC for images), which is what
``x.reshape(batch, -1)`` gives in Flax.

Two extractors:

* `from_params(params)`: a Flax linen MLP's parameter dict ``{'params': {'Dense_0': {'kernel':
  (in, out), 'bias': (out,)}, ...}}``, layers taken in creation order
  (`boundjax.models.dense_layers`). Leaves may be `boundjax.Interval` (a hyper-network), or the
  whole tree may be one `Interval` whose ``lower``/``upper`` are parameter trees.
* `from_flax(model, params, input_shape)`: any linen model that is a chain of ``nn.Dense`` and
  ``nn.Conv`` modules with ReLU between them. Each layer's matrix is the Jacobian of the module
  with respect to its (flattened) input, so a convolution becomes a sparse affine map; every
  matrix entry is one kernel entry or zero, so the matrices built from the lower and upper kernels
  are the elementwise bounds of the interval layer. The chain assumption is checked by replaying
  random inputs through ``model.apply``; a model that is not such a chain raises `ValueError`.

Forward passes here are float64 numpy (`forward`, `forward_batch`) so counterexamples can be
replayed exactly the way the MILP sees the network.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from boundjax.interval import split_tree
from boundjax.models import dense_layers

Matrix = Any  # np.ndarray or a scipy.sparse array, shape (out, in)


def _as_f64(a: Any) -> np.ndarray:
  return np.asarray(a, dtype=np.float64)


def _dense(m: Matrix) -> np.ndarray:
  return m.toarray() if sp.issparse(m) else np.asarray(m)


@dataclasses.dataclass(frozen=True)
class AffineLayer:
  """``h -> W h + b`` with ``W in [w_lower, w_upper]``, ``b in [b_lower, b_upper]`` (float64).

  ``w_*`` have shape ``(out, in)`` (dense numpy or scipy.sparse CSR), ``b_*`` shape ``(out,)``.
  """

  w_lower: Matrix
  w_upper: Matrix
  b_lower: np.ndarray
  b_upper: np.ndarray

  def __post_init__(self):
    if self.w_lower.shape != self.w_upper.shape:
      raise ValueError(
          f"AffineLayer: w_lower {self.w_lower.shape} and w_upper {self.w_upper.shape} differ.")
    if self.b_lower.shape != self.b_upper.shape or self.b_lower.shape != (self.w_lower.shape[0],):
      raise ValueError(
          f"AffineLayer: biases {self.b_lower.shape}/{self.b_upper.shape} do not match "
          f"{self.w_lower.shape[0]} outputs.")
    if np.any(self.b_lower > self.b_upper) or _any_gt(self.w_lower, self.w_upper):
      raise ValueError("AffineLayer: a lower parameter bound exceeds its upper bound.")
    for name in ("b_lower", "b_upper"):
      if not np.all(np.isfinite(getattr(self, name))):
        raise ValueError(f"AffineLayer: {name} has non-finite entries.")

  @property
  def shape(self) -> tuple[int, int]:
    return tuple(self.w_lower.shape)

  @property
  def is_point(self) -> bool:
    return (not _any_gt(self.w_upper, self.w_lower)) and bool(np.all(self.b_lower == self.b_upper))

  @classmethod
  def point(cls, w: Matrix, b: Any) -> "AffineLayer":
    w = w.astype(np.float64) if sp.issparse(w) else _as_f64(w)
    b = _as_f64(b)
    return cls(w, w, b, b)


def _any_gt(a: Matrix, b: Matrix) -> bool:
  d = a - b
  if sp.issparse(d):
    return bool(d.nnz and d.max() > 0)
  return bool(np.any(d > 0))


@dataclasses.dataclass(frozen=True)
class Network:
  """A chain of `AffineLayer` with ReLU between consecutive layers (none after the last).

  Attributes:
    layers: the affine layers in order.
    input_shape: shape of one input (without batch axis); the MILP sees it flattened.
    output: ``"logits"`` (class = argmax, first index on ties) or ``"sign"`` (one output unit,
      class 1 iff ``N(x) >= 0``, else 0: Sphynx's convention, Sphynx, §2). ``None`` (default)
      picks ``"sign"`` for one output unit and ``"logits"`` otherwise.
  """

  layers: tuple[AffineLayer, ...]
  input_shape: tuple[int, ...]
  output: str | None = None

  def __post_init__(self):
    if not self.layers:
      raise ValueError("Network: needs at least one affine layer.")
    if self.output is None:  # one output unit: a sign classifier; several: logits
      object.__setattr__(self, "output", "sign" if self.layers[-1].shape[0] == 1 else "logits")
    if self.output not in ("logits", "sign"):
      raise ValueError(f"Network: output must be 'logits' or 'sign', got {self.output!r}.")
    if self.output == "logits" and self.layers[-1].shape[0] < 2:
      raise ValueError("Network: output='logits' needs at least 2 output units; a network "
                       "with one output unit is a sign classifier (output='sign').")
    if int(np.prod(self.input_shape)) != self.layers[0].shape[1]:
      raise ValueError(
          f"Network: input_shape {self.input_shape} has {int(np.prod(self.input_shape))} "
          f"entries but the first layer takes {self.layers[0].shape[1]}.")
    for i in range(1, len(self.layers)):
      if self.layers[i].shape[1] != self.layers[i - 1].shape[0]:
        raise ValueError(
            f"Network: layer {i} takes {self.layers[i].shape[1]} inputs but layer {i - 1} "
            f"gives {self.layers[i - 1].shape[0]}.")
    if self.output == "sign" and self.layers[-1].shape[0] != 1:
      raise ValueError("Network: output='sign' needs exactly one output unit.")

  @property
  def input_size(self) -> int:
    return self.layers[0].shape[1]

  @property
  def num_outputs(self) -> int:
    return self.layers[-1].shape[0]

  @property
  def num_classes(self) -> int:
    return 2 if self.output == "sign" else self.num_outputs

  @property
  def is_point(self) -> bool:
    return all(l.is_point for l in self.layers)

  def center(self) -> "Network":
    """The concrete network at the midpoint of every parameter interval."""
    return dataclasses.replace(self, layers=tuple(
        AffineLayer.point((l.w_lower + l.w_upper) / 2, (l.b_lower + l.b_upper) / 2)
        for l in self.layers))


def forward_batch(net: Network, x: Any) -> np.ndarray:
  """Outputs of a concrete network for inputs ``x`` of shape ``(n, *input_shape)`` (float64)."""
  if not net.is_point:
    raise ValueError("forward_batch: the network has interval parameters; take a member first.")
  h = _as_f64(x).reshape(len(x), -1)
  for m, layer in enumerate(net.layers):
    h = _dense(layer.w_lower @ h.T).T + layer.b_lower if sp.issparse(layer.w_lower) else (
        h @ layer.w_lower.T + layer.b_lower)
    if m < len(net.layers) - 1:
      h = np.maximum(h, 0.0)
  return h


def forward(net: Network, x: Any) -> np.ndarray:
  """Output of a concrete network for one input."""
  return forward_batch(net, _as_f64(x)[None])[0]


def classify(net: Network, outputs: np.ndarray) -> np.ndarray:
  """Class indices for a batch of outputs under the network's output rule."""
  outputs = np.asarray(outputs)
  if net.output == "sign":
    return (outputs[..., 0] >= 0).astype(np.int64)
  return np.argmax(outputs, axis=-1)


def margins(net: Network, outputs: np.ndarray, label: int) -> np.ndarray:
  """Classification margin: > 0 only if the class is ``label``; shape ``(n,)``.

  logits: ``min_{c != label} z_label - z_c``; sign: ``N(x)`` for label 1, ``-N(x)`` for label 0.
  Ties (margin 0) count as not ``label`` for verification (conservative).
  """
  outputs = np.asarray(outputs)
  if net.output == "sign":
    return outputs[..., 0] if label == 1 else -outputs[..., 0]
  others = np.delete(outputs, label, axis=-1)
  return outputs[..., label] - others.max(axis=-1)


# ------------------------------------------------------------------------------------------------
# Extraction from Flax
# ------------------------------------------------------------------------------------------------

def from_params(params: Any, output: str | None = None) -> Network:
  """A `Network` from a Flax linen MLP's parameters (Dense layers only, ReLU between).

  Args:
    params: ``{'params': {'Dense_0': {'kernel', 'bias'}, ...}}``, the inner dict, or a list of
      layer dicts (parsed by `boundjax.models.dense_layers`, the package's one Dense-stack
      parser). Leaves may be arrays or `Interval`; the whole tree may also be one `Interval`
      over parameter trees (split by `boundjax.interval.split_tree`).
    output: ``"logits"``, ``"sign"`` or ``None`` (by the number of outputs; see `Network`).
  """
  lo, hi = split_tree(params)
  try:
    layers_lo, layers_hi = dense_layers(lo), dense_layers(hi)
  except ValueError as e:
    raise ValueError(f"from_params: {e} Use from_flax(model, ...) for other layers.") from None
  layers = [AffineLayer(_as_f64(l["kernel"]).T.copy(), _as_f64(h["kernel"]).T.copy(),
                        _as_f64(l["bias"]), _as_f64(h["bias"]))
            for l, h in zip(layers_lo, layers_hi)]
  return Network(tuple(layers), (layers[0].shape[1],), output)


def _module_affine(module, variables, in_shape) -> tuple[np.ndarray, np.ndarray]:
  """(matrix, bias) of an affine linen module at ``variables`` for one input of ``in_shape``.

  The module, with its bias zeroed, is applied once to the batch of basis vectors: column ``j``
  of the matrix is ``f(e_j)``, a sum with one non-zero term, hence exactly the kernel entry. The
  bias is the output at 0 with the real bias.
  """
  d = int(np.prod(in_shape))
  basis = np.eye(d, dtype=np.float32).reshape((d,) + tuple(in_shape))
  no_bias = jax.tree_util.tree_map(lambda a: a, variables)
  if "bias" in no_bias["params"]:
    no_bias["params"] = dict(no_bias["params"], bias=jnp.zeros_like(no_bias["params"]["bias"]))
  with jax.default_device(jax.devices("cpu")[0]):
    cols = np.asarray(module.apply(no_bias, jnp.asarray(basis)), np.float64).reshape(d, -1)
    bias = np.asarray(module.apply(variables, jnp.zeros((1,) + tuple(in_shape), jnp.float32)),
                      np.float64).reshape(-1)
  return cols.T.copy(), bias


def from_flax(model, params: Any, input_shape: Sequence[int], output: str | None = None,
              check: bool = True, sparse_threshold: float = 0.25) -> Network:
  """A `Network` from a linen model that chains ``nn.Dense``/``nn.Conv`` with ReLU between.

  Args:
    model: the linen module (``model.apply(params, x)`` gives the outputs).
    params: its variables; leaves may be `Interval` (a hyper-network).
    input_shape: the shape of one input, without the batch axis.
    output: ``"logits"`` or ``"sign"``.
    check: replay random inputs through ``model.apply`` (at the lower and upper parameters) and
      raise `ValueError` if the extracted chain does not reproduce it.
    sparse_threshold: store a layer matrix as CSR when its density is below this.

  Raises:
    ValueError: a module with parameters that is not Dense/Conv, or a model that is not a
      Dense/Conv chain with ReLU between.
  """
  import flax.linen as nn

  input_shape = tuple(int(s) for s in input_shape)
  lo_tree, hi_tree = split_tree(params)

  rng = np.random.default_rng(0)
  probe = rng.uniform(-1.0, 1.0, size=(4,) + input_shape).astype(np.float32)

  def record(p):
    calls = []

    def interceptor(next_fun, args, kwargs, context):
      mod = context.module
      if context.method_name == "__call__":
        own = mod.variables.get("params", {}) if mod.scope is not None else {}
        owns_arrays = any(not isinstance(v, dict) for v in own.values())
        if isinstance(mod, (nn.Dense, nn.Conv)):
          calls.append((mod.clone(parent=None), {"params": dict(own)},
                        tuple(np.shape(args[0])[1:])))
        elif owns_arrays:
          raise ValueError(
              f"from_flax: unsupported layer {type(mod).__name__!r} (named {mod.name!r}); "
              "only nn.Dense and nn.Conv with ReLU between them can be encoded.")
      return next_fun(*args, **kwargs)

    with nn.intercept_methods(interceptor):
      ref = model.apply(p, jnp.asarray(probe))
    return calls, np.asarray(ref, np.float64)

  same = lo_tree is hi_tree or all(
      a is b for a, b in zip(jax.tree_util.tree_leaves(lo_tree), jax.tree_util.tree_leaves(hi_tree)))
  (calls_lo, ref_lo) = record(lo_tree)
  (calls_hi, ref_hi) = (calls_lo, ref_lo) if same else record(hi_tree)
  if not calls_lo:
    raise ValueError("from_flax: the model applies no nn.Dense or nn.Conv layer.")
  layers = []
  for (mod, v_lo, shp), (_, v_hi, _) in zip(calls_lo, calls_hi):
    m_lo, b_lo = _module_affine(mod, v_lo, shp)
    m_hi, b_hi = _module_affine(mod, v_hi, shp)
    w_lo, w_hi = np.minimum(m_lo, m_hi), np.maximum(m_lo, m_hi)
    b_lo, b_hi = np.minimum(b_lo, b_hi), np.maximum(b_lo, b_hi)
    density = np.count_nonzero((w_lo != 0) | (w_hi != 0)) / max(w_lo.size, 1)
    if isinstance(mod, nn.Conv) and density < sparse_threshold:
      w_lo, w_hi = sp.csr_array(w_lo), sp.csr_array(w_hi)
    layers.append(AffineLayer(w_lo, w_hi, b_lo, b_hi))
  net = Network(tuple(layers), input_shape, output)
  if check:
    for ref, pick in ((ref_lo, "lower"), (ref_hi, "upper")):
      member = dataclasses.replace(net, layers=tuple(
          AffineLayer.point(getattr(l, "w_" + pick), getattr(l, "b_" + pick)) for l in net.layers))
      got = forward_batch(member, probe)
      ref = ref.reshape(got.shape) if ref.size == got.size else ref
      if ref.shape != got.shape or not np.allclose(got, ref, rtol=1e-4, atol=1e-4):
        raise ValueError(
            "from_flax: the model is not a chain of nn.Dense/nn.Conv layers with ReLU between "
            "them (replaying random inputs through the extracted chain does not match "
            "model.apply).")
  return net


def stack_members(stacked: Any, output: str | None = None) -> list[Network]:
  """Concrete `Network`s from stacked MLP params (every leaf has a leading member axis)."""
  leaves = jax.tree_util.tree_leaves(stacked)
  if not leaves:
    raise ValueError("stack_members: empty parameter tree.")
  n = int(np.shape(leaves[0])[0])
  host = jax.tree_util.tree_map(np.asarray, stacked)
  return [from_params(jax.tree_util.tree_map(lambda a: a[i], host), output) for i in range(n)]


def contains(hyper: Network, net: Network, tol: float = 0.0) -> bool:
  """True when every parameter of the concrete ``net`` lies in the hyper-network's intervals."""
  if len(hyper.layers) != len(net.layers):
    return False
  for h, l in zip(hyper.layers, net.layers):
    if h.shape != l.shape:
      return False
    w, wl, wu = _dense(l.w_lower), _dense(h.w_lower), _dense(h.w_upper)
    if np.any(w < wl - tol) or np.any(w > wu + tol):
      return False
    if np.any(l.b_lower < h.b_lower - tol) or np.any(l.b_lower > h.b_upper + tol):
      return False
  return True


def interval_network(layers_lo: Sequence[tuple[Any, Any]],
                     layers_hi: Sequence[tuple[Any, Any]], input_shape=None,
                     output: str | None = None) -> Network:
  """A hyper-network from lists of ``(W (out,in), b)`` lower and upper parameters."""
  layers = tuple(AffineLayer(_as_f64(wl), _as_f64(wu), _as_f64(bl), _as_f64(bu))
                 for (wl, bl), (wu, bu) in zip(layers_lo, layers_hi))
  shape = tuple(input_shape) if input_shape is not None else (layers[0].shape[1],)
  return Network(layers, shape, output)


# ------------------------------------------------------------------------------------------------
# Extraction from any JAX function
# ------------------------------------------------------------------------------------------------

# Primitives that are linear in their floating-point operands jointly, provided every other
# operand (indices, predicates, shapes) does not depend on the input.
_LINEAR_PRIMITIVES = frozenset({
    "add", "add_any", "sub", "neg", "reshape", "transpose", "broadcast_in_dim", "squeeze",
    "expand_dims", "concatenate", "slice", "dynamic_slice", "dynamic_update_slice", "gather",
    "scatter", "scatter-add", "scatter_add", "pad", "rev", "select_n", "reduce_sum", "cumsum",
    "reduce_window_sum", "copy", "copy_p", "convert_element_type", "split",
    "sharding_constraint", "optimization_barrier",
})
# Linear in each operand when the others are constant: affine iff exactly one depends on x.
_BILINEAR_PRIMITIVES = frozenset({"mul", "dot_general", "conv_general_dilated"})
_POOLING_PRIMITIVES = frozenset({
    "reduce_window_max", "reduce_window_min", "reduce_max", "reduce_min", "argmax", "argmin",
    "cummax", "cummin", "sort", "reduce_window"})


@dataclasses.dataclass
class _Activation:
  """``out = c + sgn * relu(sgn * (z - c))``: ``max(z, c)`` (``sgn = +1``) or ``min(z, c)``
  (``sgn = -1``) with a constant ``c``; ``c = 0, sgn = +1`` is the ReLU. The network's
  pre-activation is ``sgn * (z - c)``, flattened."""

  z: Any           # the input atom (a Var of the program)
  out: Any         # the output Var
  c: np.ndarray    # float64, broadcast to the output shape
  sgn: float
  eqn: Any         # the equation, for messages


@dataclasses.dataclass
class _Segment:
  """The equations from one activation (or the input) to the next (or the output)."""

  input: Any                    # the Var the segment reads (program input or activation output)
  input_shape: tuple[int, ...]
  input_map: tuple[np.ndarray, float]  # (c, sgn): the Var's value is c + sgn * s for the state s
  eqns: list = dataclasses.field(default_factory=list)
  end: _Activation | None = None       # None for the last segment (ends at the output)


def _is_float(a: Any) -> bool:
  try:
    return jnp.issubdtype(jnp.result_type(a), jnp.floating)
  except TypeError:
    return False


def _f64(v: Any) -> Any:
  """Floating values as float64 (everything else unchanged)."""
  return jnp.asarray(v, jnp.float64) if _is_float(v) else v


def _function_error(msg: str, eqn: Any = None) -> ValueError:
  where = f" (at {eqn.where()})" if eqn is not None else ""
  return ValueError(f"from_function: {msg}{where}.")


def _constant_operand(a: Any, program, consts: dict) -> np.ndarray | None:
  """The value of a constant (input-independent) operand as float64 numpy, else None."""
  from boundjax.core.ir import Lit
  if isinstance(a, Lit):
    return np.asarray(a.val, np.float64)
  if a in program.depends:
    return None
  return np.asarray(consts[a], np.float64)


def _as_activation(eqn, program, consts: dict) -> list[_Activation] | None:
  """The eqn as one or two activations (``max``/``min``/``clamp`` with constant bounds), or None
  when it is not one. ``max``/``min`` of two input-dependent values raises (pooling-like)."""
  from boundjax.core.ir import Var
  name = eqn.name
  if name in ("max", "min"):
    dep = [isinstance(a, Var) and a in program.depends for a in eqn.invars]
    if all(dep):
      raise _function_error(
          f"'{name}' of two input-dependent values (max pooling or a similar nonlinearity) is "
          "not encodable yet; only max(z, c) / min(z, c) with a constant c (ReLU, clipping) are",
          eqn)
    z = eqn.invars[dep.index(True)]
    c = _constant_operand(eqn.invars[dep.index(False)], program, consts)
    pairs = [(z, eqn.outvars[0], c, 1.0 if name == "max" else -1.0)]
  elif name == "clamp":  # clamp(lo, z, hi) = min(max(z, lo), hi)
    lo_a, z, hi_a = eqn.invars
    if not (isinstance(z, Var) and z in program.depends):
      raise _function_error("clamp with input-dependent bounds is not encodable", eqn)
    lo, hi = (_constant_operand(a, program, consts) for a in (lo_a, hi_a))
    if lo is None or hi is None:
      raise _function_error("clamp with input-dependent bounds is not encodable", eqn)
    from boundjax.core.ir import Var as _V
    mid = _V(eqn.outvars[0].aval, -1)
    pairs = [(z, mid, lo, 1.0), (mid, eqn.outvars[0], hi, -1.0)]
  else:
    return None
  acts = []
  shape = tuple(eqn.outvars[0].aval.shape)
  for z, out, c, sgn in pairs:
    if tuple(z.aval.shape) != shape:
      raise _function_error(f"'{name}' broadcasts its input-dependent operand", eqn)
    c = np.broadcast_to(c, shape).astype(np.float64)
    identity_value = -np.inf if sgn > 0 else np.inf
    if np.all(c == identity_value):
      acts.append(_Activation(z, out, c, sgn, None))  # max(z, -inf): the identity
      continue
    if not np.all(np.isfinite(c)):
      raise _function_error(f"'{name}' with a partly infinite constant bound", eqn)
    acts.append(_Activation(z, out, c, sgn, eqn))
  return acts


def _check_affine_eqn(eqn, program) -> None:
  """Raises unless ``eqn`` (which reads an input-dependent value) is affine in those values."""
  from boundjax.core.ir import Var
  name = eqn.name
  dep = [isinstance(a, Var) and a in program.depends for a in eqn.invars]
  if name in _POOLING_PRIMITIVES:
    raise _function_error(
        f"'{name}' (max pooling or another order statistic) is not encodable yet; the MILP "
        "encoding supports affine maps and ReLU (max(z, c) with constant c) only", eqn)
  if name in _BILINEAR_PRIMITIVES:
    if sum(dep) != 1:
      raise _function_error(
          f"'{name}' of two input-dependent values is a product, not an affine map", eqn)
    return
  if name == "div":
    if dep[1]:
      raise _function_error("'div' by an input-dependent value is not affine", eqn)
    return
  if name == "integer_pow" and eqn.params.get("y") == 1:
    return
  if name in _LINEAR_PRIMITIVES:
    for a, d in zip(eqn.invars, dep):
      if d and not _is_float(a.aval.dtype):
        raise _function_error(
            f"'{name}' uses an input-dependent value as an index or predicate (not affine)", eqn)
    if name == "convert_element_type" and not jnp.issubdtype(eqn.params["new_dtype"],
                                                              jnp.floating):
      raise _function_error(
          f"'convert_element_type' to {eqn.params['new_dtype']} (rounding) is not affine", eqn)
    return
  raise _function_error(
      f"primitive '{name}' is not affine; only affine maps (dense, conv, scaling, reshapes, "
      "adds, ...) with ReLU between them can be encoded", eqn)


def _bind_f64(eqn, values: list) -> list:
  """Evaluates ``eqn`` with every floating operand and result in float64."""
  params = dict(eqn.params)
  if eqn.name == "convert_element_type" and jnp.issubdtype(params["new_dtype"], jnp.floating):
    params["new_dtype"] = np.dtype(np.float64)
  pet = params.get("preferred_element_type")
  if pet is not None and jnp.issubdtype(pet, jnp.floating):
    params["preferred_element_type"] = np.dtype(np.float64)
  return dataclasses.replace(eqn, params=params).bind([_f64(v) for v in values])


def _split_chain(program, consts: dict) -> list[_Segment]:
  """Cuts the input-dependent equations into segments at the activations (checks the chain)."""
  from boundjax.core.ir import Var
  x = program.invars[0]
  segs = [_Segment(x, tuple(x.aval.shape), (np.zeros(()), 1.0))]
  stage = {x: 0}
  last_act = None
  for e in program.eqns:
    if not e.abstract:
      continue
    stages = {stage[a] for a in e.invars if isinstance(a, Var) and a in program.depends}
    if stages != {len(segs) - 1}:
      raise _function_error(
          f"the function is not a chain of affine maps with ReLU between them: '{e.name}' reads "
          f"a value from before the activation at {last_act.where()} (a skip connection or "
          "branch); only chains can be encoded", e)
    acts = _as_activation(e, program, consts)
    if acts is None:
      _check_affine_eqn(e, program)
      segs[-1].eqns.append(e)
      for o in e.outvars:
        stage[o] = len(segs) - 1
      continue
    for act in acts:
      if act.eqn is None:  # the identity: the output is the input
        segs[-1].eqns.append(_IdentityEqn(act.z, act.out))
        stage[act.out] = len(segs) - 1
        continue
      segs[-1].end = act
      segs.append(_Segment(act.out, tuple(act.out.aval.shape), (act.c, act.sgn)))
      stage[act.out] = len(segs) - 1
      last_act = e
  out = program.outvars[0]
  if not (isinstance(out, Var) and out in program.depends):
    raise _function_error("the output does not depend on the input")
  if stage[out] != len(segs) - 1:
    raise _function_error(
        f"the output is computed from a value before the activation at {last_act.where()}; "
        "only chains can be encoded")
  return segs


@dataclasses.dataclass
class _IdentityEqn:
  """``out = z`` (a ``max(z, -inf)`` / ``min(z, inf)`` that changes nothing)."""

  z: Any
  out: Any
  name: str = "identity"

  @property
  def invars(self):
    return [self.z]

  @property
  def outvars(self):
    return [self.out]

  def bind(self, values):
    return list(values)


def _segment_fn(seg: _Segment, program, consts: dict):
  """``s -> pre-activation of the next layer`` (or the output), flat float64 in and out."""
  from boundjax.core.ir import Lit

  c_in, sgn_in = seg.input_map
  c_in = jnp.asarray(c_in, jnp.float64)

  def read(env, a):
    if isinstance(a, Lit):
      return a.val
    return env[a] if a in env else consts[a]

  def fn(s):
    env = {seg.input: c_in + sgn_in * jnp.reshape(s, seg.input_shape)}
    for e in seg.eqns:
      vals = [read(env, a) for a in e.invars]
      outs = e.bind(vals) if isinstance(e, _IdentityEqn) else _bind_f64(e, vals)
      for v, o in zip(e.outvars, outs):
        env[v] = o
    if seg.end is None:
      return jnp.reshape(_f64(read(env, program.outvars[0])), (-1,))
    z = _f64(read(env, seg.end.z))
    return jnp.reshape(seg.end.sgn * (z - jnp.asarray(seg.end.c)), (-1,))

  return fn


def _segment_layer(fn, n_in: int, sparse_threshold: float, rng: np.random.Generator,
                   eqns: list, max_entries: int = 1 << 22) -> AffineLayer:
  """The exact affine layer of an affine segment ``fn``: ``b = fn(0)`` and column ``j`` of ``W``
  the directional derivative of ``fn`` along ``e_j`` (forward mode), which for an affine ``fn``
  is ``fn(e_j) - fn(0)`` without the cancellation error of that subtraction. Affinity is checked
  at random points: ``fn(p) = W p + b`` to ``1e-9`` relative.

  Evaluation is eager (vmapped primitives, no ``jax.jit`` of the segment): JAX caches each
  primitive's compilation by shape, so later networks of the same architecture are fast.
  """
  # fn at 0 and at random points (scale 1 and 100), in one batch
  probes = np.concatenate([np.zeros((1, n_in)), rng.uniform(-1, 1, (3, n_in)),
                           rng.uniform(-100, 100, (2, n_in))])
  values = np.asarray(jax.vmap(fn)(jnp.asarray(probes)), np.float64)
  b, got, probes = values[0], values[1:], probes[1:]
  n_out = b.size
  zero = jnp.zeros((n_in,), jnp.float64)
  jvp = jax.vmap(lambda t: jax.jvp(fn, (zero,), (t,))[1])
  chunk = max(1, min(n_in, max_entries // max(n_out, 1)))
  rows, cols, vals = [], [], []
  for start in range(0, n_in, chunk):
    stop = min(n_in, start + chunk)
    basis = np.zeros((stop - start, n_in))
    basis[np.arange(stop - start), np.arange(start, stop)] = 1.0
    block = np.asarray(jvp(jnp.asarray(basis)), np.float64)  # (chunk, n_out): columns of W
    j, i = np.nonzero(block)
    rows.append(i)
    cols.append(j + start)
    vals.append(block[j, i])
  w = sp.csr_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                   shape=(n_out, n_in))
  if not (np.all(np.isfinite(w.data)) and np.all(np.isfinite(b))):
    raise _function_error("a layer has non-finite weights or biases")
  if w.nnz >= sparse_threshold * n_out * n_in:
    w = w.toarray()
  want = np.asarray(w @ probes.T).T + b
  scale = np.asarray(abs(w) @ np.abs(probes).T).T + np.abs(b)
  if not np.all(np.abs(got - want) <= 1e-9 * scale + 1e-12):
    names = sorted({e.name for e in eqns})
    raise _function_error(
        "a segment between ReLUs is not affine in its input (evaluating it at random points "
        f"disagrees with its linearisation); its primitives: {', '.join(names)}")
  return AffineLayer.point(w, b)


def from_function(apply_fn, params: Any, input_shape: Sequence[int], output: str | None = None,
                  *, sparse_threshold: float = 0.25, check: bool = True,
                  seed: int = 0) -> Network:
  """A `Network` from any JAX function ``x -> apply_fn(params, x)`` that is a chain of affine maps
  with ReLU between them (an imported ONNX graph, a Flax model's ``apply``, plain ``jnp`` code).

  The function is traced once (`boundjax.core.program.flatten` inlines every call, including
  ``jax.nn.relu``'s ``custom_jvp_call``) with ``params`` cast to float64; equations that do not
  depend on ``x`` (e.g. folding batch-norm statistics) are evaluated as constants. The
  ``x``-dependent equations are cut at every activation ``max(z, c)`` / ``min(z, c)`` /
  ``clamp`` with a constant ``c`` (``c = 0``: ReLU; a general ``c`` is the ReLU
  ``c ± relu(±(z - c))``, so clipping also encodes). Each segment between activations must be
  affine: only affine primitives may occur (dense, conv, products and quotients by constants,
  reshape/transpose/pad/slice/concatenate/gather, sums, ...) and the segment ``f`` is checked
  numerically against its matrix. Its layer is ``b = f(0)``, ``W[:, j] = D f(0) e_j`` (the
  forward-mode derivative, equal to ``f(e_j) - f(0)`` for affine ``f``), all in float64; floating
  casts inside the function (e.g. to float32) are evaluated in float64, so the network is the
  function in real arithmetic with its (float32-valued) parameters.

  Args:
    apply_fn: ``apply_fn(params, x) -> outputs`` (one array; its flattening ``.reshape(-1)`` is
      the network output).
    params: the parameter pytree (concrete arrays; not `Interval`).
    input_shape: the shape of ``x``, including any batch axis the function expects, e.g.
      ``(1, 1, 1, 5)`` for ACAS Xu ONNX models or ``(1, 784)``. The network's input is
      ``x.reshape(-1)`` (row-major), and ``Network.input_shape`` is ``input_shape``.
    output: ``"logits"``, ``"sign"`` or ``None`` (see `Network`).
    sparse_threshold: layers with fewer non-zeros than this fraction are stored as CSR.
    check: also replay random inputs through ``apply_fn`` (float64 parameters) and require
      agreement (``1e-5`` relative; the function may compute in float32 internally).
    seed: for the random check points.

  Raises:
    ValueError: naming the first primitive that is not affine (or not a ReLU-like activation)
      and the user's source line, e.g. ``tanh``, max pooling (``reduce_window_max``, not
      encodable yet), a product of two input-dependent values, or a skip connection.
  """
  from boundjax.core.program import evaluate_concrete, flatten, mark_dependence
  from boundjax.interval import is_interval

  input_shape = tuple(int(s) for s in input_shape)
  if any(is_interval(l) for l in jax.tree_util.tree_leaves(params, is_leaf=is_interval)):
    raise ValueError("from_function: interval parameters are not supported here; use "
                     "from_flax or from_params for hyper-networks.")
  rng = np.random.default_rng(seed)
  with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
    p64 = jax.tree_util.tree_map(
        lambda a: np.asarray(a, np.float64) if _is_float(a) and not isinstance(a, float) else a,
        params)

    def fn(x):
      return apply_fn(p64, x)

    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(
        jax.ShapeDtypeStruct(input_shape, jnp.float64))
    if len(jax.tree_util.tree_leaves(out_shape)) != 1:
      raise ValueError("from_function: the function must return one array, got "
                       f"{jax.tree_util.tree_structure(out_shape)}.")
    program = mark_dependence(flatten(closed, recognise=None), [True])
    consts = {v: _f64(a) for v, a in evaluate_concrete(program, [None]).items()}
    segments = _split_chain(program, consts)
    layers = []
    n_in = int(np.prod(input_shape))
    for seg in segments:
      layer = _segment_layer(_segment_fn(seg, program, consts), n_in, sparse_threshold, rng,
                             seg.eqns)
      layers.append(layer)
      n_in = layer.shape[0]
    net = Network(tuple(layers), input_shape, output)
    if check:
      probes = rng.uniform(-1.0, 1.0, (3,) + input_shape)
      try:
        ref = np.asarray(jax.vmap(fn)(jnp.asarray(probes)), np.float64)
      except Exception:  # a function that does not vmap: one input at a time
        ref = np.stack([np.asarray(fn(jnp.asarray(p)), np.float64) for p in probes])
      ref = ref.reshape(len(probes), -1)
  if check:
    got = forward_batch(net, probes)
    if got.shape != ref.shape or not np.allclose(got, ref, rtol=1e-5,
                                                 atol=1e-5 * (1 + np.abs(ref).max())):
      raise ValueError(
          "from_function: the extracted network does not reproduce apply_fn on random inputs "
          f"(max difference {np.abs(got - ref).max() if got.shape == ref.shape else 'shape'}); "
          "please report this with the function.")
  return net
