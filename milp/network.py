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
