"""Networks as chains of affine layers with ReLU between them, in float64 (MILP-facing).

A `Network` is ``x -> A_1 -> ReLU -> A_2 -> ReLU -> ... -> A_L`` where every affine map
``A_m(h) = W_m h + b_m`` may have interval parameters ``W_m in [W_lo, W_hi]``,
``b_m in [b_lo, b_hi]`` (a hyper-network, Sphynx, §4). A concrete network is the special
case ``W_lo == W_hi``. Inputs are flattened in row-major order (NHWC for images), which is what
``x.reshape(batch, -1)`` gives in Flax.

Extractors (all give the same kind of chain; `from_function` is the general one):

* `from_function(apply_fn, params, input_shape)`: any JAX function made of affine maps, ReLU,
  clipping and max pooling, read off its `boundjax.core.program` Program (the affine-chain view
  of the program layer). Parameters may be `boundjax.Interval` leaves (a hyper-network): every
  layer's matrix and bias are then bounded over the parameter box by ``bj.ibp`` (sound mode).
* `from_flax(model, params, input_shape)`: `from_function` of a linen model's ``apply``.
* `from_params(params)`: a Flax linen MLP's parameter dict ``{'params': {'Dense_0': {'kernel':
  (in, out), 'bias': (out,)}, ...}}``, layers taken in creation order
  (`boundjax.models.dense_layers`): the chain `from_function` gives for `boundjax.models.MLP`,
  read directly off the kernels (exact, also for `Interval` leaves, and without a trace).

Forward passes here are float64 numpy (`forward`, `forward_batch`) so counterexamples can be
replayed exactly the way the MILP sees the network.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from boundjax.core import primitives
from boundjax.core.interval import Interval, is_interval, join_tree, lower_of, split_tree, upper_of
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
      over parameter trees (split by `boundjax.core.interval.split_tree`).
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


def from_flax(model, params: Any, input_shape: Sequence[int], output: str | None = None,
              check: bool = True, sparse_threshold: float = 0.25) -> Network:
  """A `Network` from a linen model: `from_function` of ``model.apply`` on one input of
  ``input_shape`` (with a batch axis of 1 added), so any model `from_function` encodes (Dense,
  Conv, pooling, skip connections, folded normalisation, ...) and interval parameters (a
  hyper-network) the same way.

  Args:
    model: the linen module (``model.apply(params, x)`` gives the outputs).
    params: its variables; leaves may be `Interval` (a hyper-network).
    input_shape: the shape of one input, without the batch axis.
    output: ``"logits"`` or ``"sign"``.
    check: replay random inputs through ``model.apply`` (see `from_function`).
    sparse_threshold: store a layer matrix as CSR when its density is below this.

  Raises:
    ValueError: naming the first operation of the model that cannot be encoded, with its line.
  """
  input_shape = tuple(int(s) for s in input_shape)
  net = from_function(lambda p, x: model.apply(p, x), params, (1,) + input_shape, output,
                      sparse_threshold=sparse_threshold, check=check)
  return dataclasses.replace(net, input_shape=input_shape)


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
#
# The function's input-dependent equations are compiled into ReLU layers. A *boundary* (one
# ReLU layer of the `Network`) is a list of parts, each giving some of the layer's flat
# pre-activations from the values computed so far (``pre``) and, from the ReLU outputs ``s``,
# values of the next segment (``post``):
#
# * an activation ``max(z, c)`` / ``min(z, c)`` with constant ``c``: ``out = c ± relu(±(z - c))``;
# * a carried value ``v`` read again after the layer (a skip connection or a parallel branch):
#   ``v = relu(v) - relu(-v)``, or ``relu(v)`` alone when ``v >= 0`` by construction;
# * one level of a max tournament (max pooling, ``max`` of two input-dependent values):
#   ``max(a, b) = relu(a - b) + b`` with ``b`` carried as above; ``ceil(log2 w)`` levels for
#   windows of ``w`` elements, exact (the ReLU form of max, e.g. Tjeng et al. 2019, §3's max is
#   the same function; here it needs no new constraint type).
#
# Between boundaries, segments of affine equations are evaluated in float64 to build the layers.

# What each primitive computes is classified once, in `boundjax.core.primitives`, for every table.
_LINEAR_PRIMITIVES = primitives.LINEAR  # affine once index and predicate operands are concrete
_BILINEAR_PRIMITIVES = primitives.BILINEAR  # affine iff exactly one operand depends on x
_ORDER_PRIMITIVES = primitives.PIECEWISE_CONSTANT  # order statistics, roundings: not encodable
_KEEPS_NONNEG = primitives.KEEPS_NONNEG  # non-negative operands give a non-negative result


def _is_float(a: Any) -> bool:
  try:
    return jnp.issubdtype(jnp.result_type(a), jnp.floating)
  except TypeError:
    return False


def _f64(v: Any) -> Any:
  """Floating values as float64 (everything else unchanged)."""
  return jnp.asarray(v, jnp.float64) if _is_float(v) else v


def _function_error(msg: str, eqn: Any = None) -> ValueError:
  where = f" (at {eqn.where()})" if eqn is not None and hasattr(eqn, "where") else ""
  return ValueError(f"from_function: {msg}{where}.")


def _size(shape: Sequence[int]) -> int:
  return int(np.prod(shape, dtype=np.int64))


class _Tmp:
  """A value introduced by the compiler (not a variable of the traced program)."""

  def __init__(self, shape: tuple[int, ...], name: str):
    self.shape, self.name = tuple(shape), name

  def __repr__(self):
    return f"<{self.name} {list(self.shape)}>"


@dataclasses.dataclass
class _Step:
  """An affine step of a segment that is not a program equation: ``outs = fn(*ins)``; ``key``
  describes ``fn`` (with the slots of ``invars``/``outvars``, see `_segment_key`)."""

  name: str
  invars: list
  outvars: list
  fn: Callable
  key: tuple = ()

  def bind(self, values: list) -> list:
    return self.fn(*values)


@dataclasses.dataclass
class _ActPart:
  """``out = c + sgn * relu(sgn * (z - c))``: ``max(z, c)`` for ``sgn = 1``, ``min(z, c)`` for
  ``sgn = -1``; pre-activation ``sgn * (z - c)``."""

  z: Any
  out: Any
  c: np.ndarray
  sgn: float

  @property
  def size(self) -> int:
    return self.c.size

  def key(self, slot) -> tuple:  # c is passed at run time (see `_segment_fn`)
    return ("act", slot(self.z), slot(self.out), self.c.shape, self.sgn)

  def pre(self, env: dict, c):
    return jnp.reshape(self.sgn * (env[self.z] - c), (-1,))

  def post(self, s, env: dict, c) -> None:
    env[self.out] = c + self.sgn * jnp.reshape(s, self.c.shape)


@dataclasses.dataclass
class _CarryPart:
  """A value read after the layer: ``v = relu(v) - relu(-v)`` (``relu(v)`` when ``v >= 0``)."""

  v: Any
  shape: tuple[int, ...]
  nonneg: bool

  @property
  def size(self) -> int:
    return _size(self.shape) * (1 if self.nonneg else 2)

  def key(self, slot) -> tuple:
    return ("carry", slot(self.v), self.shape, self.nonneg)

  def pre(self, env: dict, c=None):
    flat = jnp.reshape(env[self.v], (-1,))
    return flat if self.nonneg else jnp.concatenate([flat, -flat])

  def post(self, s, env: dict, c=None) -> None:
    n = _size(self.shape)
    v = s[:n] if self.nonneg else s[:n] - s[n:]
    env[self.v] = jnp.reshape(v, self.shape)


@dataclasses.dataclass
class _MaxSource:
  """The flat vector ``u = sgn * concat(v.reshape(-1) ...)`` a max tournament starts from (each
  ``v`` broadcast to ``shape`` first when given)."""

  vars: list
  sgn: float = 1.0
  shape: tuple[int, ...] | None = None

  def key(self, slot) -> tuple:
    return ("src", tuple(slot(v) for v in self.vars), self.sgn, self.shape)

  def __call__(self, env: dict):
    vals = [env[v] if self.shape is None else jnp.broadcast_to(env[v], self.shape)
            for v in self.vars]
    u = jnp.concatenate([jnp.reshape(v, (-1,)) for v in vals])
    return u if self.sgn == 1.0 else self.sgn * u


def _index_key(a: np.ndarray) -> tuple:
  return (a.shape, a.tobytes())


@dataclasses.dataclass
class _MaxLevel:
  """One level of a max tournament over a flat vector ``u``: pairs ``(a, b)`` give
  ``max(u_a, u_b) = relu(u_a - u_b) + u_b`` and unpaired entries pass (both carried as
  ``relu(v) - relu(-v)``, or ``relu(v)`` when ``u >= 0``). The next vector holds the pairs' maxima
  then the unpaired entries; after the last level, ``out = sgn * u[final]`` reshaped."""

  src: _MaxSource
  a: np.ndarray
  b: np.ndarray
  odd: np.ndarray
  nonneg: bool
  dst: Any
  final: tuple[np.ndarray, float, tuple[int, ...]] | None  # (index, sgn, out shape)

  @property
  def size(self) -> int:
    n_pass = self.b.size + self.odd.size
    return self.a.size + n_pass * (1 if self.nonneg else 2)

  def key(self, slot) -> tuple:
    final = None if self.final is None else (_index_key(self.final[0]),) + self.final[1:]
    return ("max", self.src.key(slot), _index_key(self.a), _index_key(self.b),
            _index_key(self.odd), self.nonneg, slot(self.dst), final)

  def pre(self, env: dict, c=None):
    u = self.src(env)
    passed = jnp.concatenate([u[self.b], u[self.odd]])
    parts = [u[self.a] - u[self.b], passed] + ([] if self.nonneg else [-passed])
    return jnp.concatenate(parts)

  def post(self, s, env: dict, c=None) -> None:
    p, q = self.a.size, self.b.size + self.odd.size
    passed = s[p:p + q] if self.nonneg else s[p:p + q] - s[p + q:p + 2 * q]
    u = jnp.concatenate([s[:p] + passed[:p], passed[p:]])
    if self.final is None:
      env[self.dst] = u
    else:
      index, sgn, shape = self.final
      env[self.dst] = jnp.reshape(sgn * u[index], shape)


@dataclasses.dataclass
class _Boundary:
  """One ReLU layer: its parts' pre-activations concatenated."""

  parts: list
  eqn: Any  # the equation that made it (for messages)

  @property
  def size(self) -> int:
    return sum(p.size for p in self.parts)

  @property
  def constants(self) -> list[np.ndarray]:
    """The run-time constants of its parts (activation bounds ``c``), in part order."""
    return [p.c for p in self.parts if isinstance(p, _ActPart)]

  def pre(self, env: dict, cs: Sequence[Any]):
    cs, out = iter(cs), []
    for p in self.parts:
      out.append(p.pre(env, next(cs) if isinstance(p, _ActPart) else None))
    return jnp.concatenate(out)

  def post(self, s, cs: Sequence[Any]) -> dict:
    env, start, cs = {}, 0, iter(cs)
    for p in self.parts:
      p.post(s[start:start + p.size], env, next(cs) if isinstance(p, _ActPart) else None)
      start += p.size
    return env


@dataclasses.dataclass
class _Segment:
  """Affine steps from one boundary (or the input) to the next (or the output)."""

  start: _Boundary | None
  steps: list = dataclasses.field(default_factory=list)
  end: _Boundary | None = None


def _tournament(groups: Sequence[np.ndarray]) -> tuple[list[tuple], np.ndarray]:
  """Pairings ``[(a, b, odd)]`` of each level and the final index per group: the max over every
  group of distinct indices into a vector, by halving each group per level."""
  levels = []
  groups = [np.asarray(g, np.int64) for g in groups]
  while any(g.size > 1 for g in groups):
    a, b, odd, new = [], [], [], []
    for g in groups:
      n_pairs = g.size // 2
      new.append((len(a) + np.arange(n_pairs), len(odd) + np.arange(g.size % 2)))
      a.extend(g[0:2 * n_pairs:2])
      b.extend(g[1:2 * n_pairs:2])
      odd.extend(g[2 * n_pairs:])
    levels.append((np.array(a, np.int64), np.array(b, np.int64), np.array(odd, np.int64)))
    groups = [np.concatenate([pairs, len(a) + odds]) for pairs, odds in new]
  return levels, np.array([g[0] for g in groups], np.int64)


def _window_groups(eqn, in_shape: tuple[int, ...]) -> list[np.ndarray]:
  """For ``reduce_window_max``: per output cell, the distinct flat input indices of its window
  (positions in the padding hold ``-inf`` and never win, so they are left out)."""
  p = eqn.params
  if any(d != 1 for d in p["base_dilation"]):
    raise _function_error("reduce_window_max with base dilation is not encodable", eqn)
  out_shape = tuple(eqn.outvars[0].aval.shape)
  rank = len(in_shape)
  cells = np.indices(out_shape).reshape(rank, -1).T
  window = np.indices(p["window_dimensions"]).reshape(rank, -1).T
  pad_lo = np.array([lo for lo, _ in p["padding"]])
  coords = (cells[:, None, :] * np.array(p["window_strides"])
            + window[None] * np.array(p["window_dilation"]) - pad_lo)
  valid = np.all((coords >= 0) & (coords < np.array(in_shape)), axis=-1)
  flat = np.ravel_multi_index(tuple(np.clip(coords, 0, np.array(in_shape) - 1).transpose(2, 0, 1)),
                              in_shape)
  groups = [np.unique(f[v]) for f, v in zip(flat, valid)]
  if any(g.size == 0 for g in groups):
    raise _function_error("a max-pooling window lies entirely in the padding", eqn)
  return groups


def _reduce_groups(eqn, in_shape: tuple[int, ...]) -> list[np.ndarray]:
  """For ``reduce_max``/``reduce_min`` over ``axes``: per output cell, its flat input indices."""
  axes = tuple(eqn.params["axes"])
  keep = [d for d in range(len(in_shape)) if d not in axes]
  idx = np.arange(_size(in_shape)).reshape(in_shape).transpose(keep + list(axes))
  return list(idx.reshape(_size([in_shape[d] for d in keep]), -1))


class _Compiler:
  """Cuts the input-dependent equations of a flat program into affine segments and ReLU layers."""

  def __init__(self, program, consts: dict):
    from boundjax.core.ir import Lit, Var
    self.Lit, self.Var = Lit, Var
    self.program, self.consts = program, consts
    self.deps = [e for e in program.eqns if e.abstract]
    self.nonneg: set = set()
    self.last_use: dict = {}
    for i, e in enumerate(self.deps):
      for a in e.invars:
        if self.is_dep(a):
          self.last_use[a] = i
    for a in program.outvars:
      if self.is_dep(a):
        self.last_use[a] = len(self.deps)

  # -- helpers -----------------------------------------------------------------------------------
  def is_dep(self, a: Any) -> bool:
    return isinstance(a, self.Var) and a in self.program.depends

  def constant(self, a: Any) -> np.ndarray | None:
    """The value of an input-independent operand (float64 numpy), else None."""
    if isinstance(a, self.Lit):
      return np.asarray(a.val, np.float64)
    if self.is_dep(a):
      return None
    return np.asarray(self.consts[a], np.float64)

  def operand_nonneg(self, a: Any) -> bool:
    if self.is_dep(a):
      return a in self.nonneg
    value = a.val if isinstance(a, self.Lit) else self.consts[a]
    return not _is_float(value) or bool(np.all(np.asarray(value, np.float64) >= 0))

  # -- compiling ---------------------------------------------------------------------------------
  def compile(self) -> list[_Segment]:
    x = self.program.invars[0]
    self.segments = [_Segment(None)]
    self.live = {x: tuple(x.aval.shape)}  # input-dependent values available in this segment
    for i, e in enumerate(self.deps):
      self.check_reads(e)
      if e.name in ("max", "min", "clamp"):
        handled = self.activation(i, e)
        if handled:
          continue
      if e.name in ("reduce_window_max", "reduce_max", "reduce_min", "max", "min"):
        self.max_pool(i, e)
        continue
      self.check_affine(e)
      self.segments[-1].steps.append(e)
      self.define(e.outvars, nonneg=e.name in _KEEPS_NONNEG
                  and all(self.operand_nonneg(a) for a in e.invars))
    out = self.program.outvars[0]
    if not self.is_dep(out):
      raise _function_error("the output does not depend on the input")
    return self.segments

  def check_reads(self, e) -> None:
    for a in e.invars:
      if self.is_dep(a) and a not in self.live:  # pragma: no cover - a compiler bug
        raise _function_error(f"internal error: '{e.name}' reads a value not carried", e)

  def define(self, outs, nonneg: bool) -> None:
    for o in outs:
      self.live[o] = tuple(o.shape)
      if nonneg:
        self.nonneg.add(o)

  def boundary(self, i: int, parts: list, eqn, defined: dict) -> None:
    """Closes the current segment with a ReLU layer of ``parts`` plus every value still read
    after equation ``i`` (carried), and opens the next segment."""
    carried = [v for v in self.live if self.last_use.get(v, -1) > i]
    parts = parts + [_CarryPart(v, self.live[v], v in self.nonneg) for v in carried]
    b = _Boundary(parts, eqn)
    self.segments[-1].end = b
    self.segments.append(_Segment(b))
    self.live = {v: self.live[v] for v in carried}
    self.live.update(defined)

  def activation(self, i: int, e) -> bool:
    """``max(z, c)`` / ``min(z, c)`` / ``clamp(lo, z, hi)`` with constant bounds as ReLU layers;
    False when an operand besides ``z`` depends on the input (a max pooling-like max)."""
    if e.name == "clamp":
      lo_a, z, hi_a = e.invars
      lo, hi = self.constant(lo_a), self.constant(hi_a)
      if lo is None or hi is None or not self.is_dep(z):
        raise _function_error("clamp with input-dependent bounds is not encodable", e)
      mid = _Tmp(e.outvars[0].aval.shape, "clamp")
      steps = [(z, mid, lo, 1.0), (mid, e.outvars[0], hi, -1.0)]
    else:
      dep = [self.is_dep(a) for a in e.invars]
      if all(dep):
        return False
      z = e.invars[dep.index(True)]
      c = self.constant(e.invars[dep.index(False)])
      steps = [(z, e.outvars[0], c, 1.0 if e.name == "max" else -1.0)]
    shape = tuple(e.outvars[0].aval.shape)
    for z, out, c, sgn in steps:
      if tuple(z.shape) != shape:
        raise _function_error(f"'{e.name}' broadcasts its input-dependent operand", e)
      c = np.broadcast_to(c, shape).astype(np.float64)
      if np.all(c == (-np.inf if sgn > 0 else np.inf)):  # max(z, -inf): the identity
        self.segments[-1].steps.append(_Step("identity", [z], [out], lambda v: [v],
                                             ("identity",)))
        self.define([out], nonneg=z in self.nonneg)
        continue
      if not np.all(np.isfinite(c)):
        raise _function_error(f"'{e.name}' with a partly infinite constant bound", e)
      self.boundary(i, [_ActPart(z, out, c, sgn)], e, {out: shape})
      if sgn > 0 and np.all(c >= 0):
        self.nonneg.add(out)
    return True

  def max_pool(self, i: int, e) -> None:
    """``reduce_window_max`` / ``reduce_max`` / ``reduce_min`` / ``max`` or ``min`` of two
    input-dependent values, as a tournament of ReLU layers."""
    out = e.outvars[0]
    out_shape = tuple(out.aval.shape)
    sgn = -1.0 if e.name in ("reduce_min", "min") else 1.0
    if e.name in ("max", "min"):
      n = _size(out_shape)
      nonneg = all(self.operand_nonneg(a) for a in e.invars) and sgn > 0
      groups = list(np.stack([np.arange(n) + k * n for k in range(len(e.invars))], axis=1))
      src = _MaxSource(list(e.invars), sgn, out_shape)
    else:
      operand = e.invars[0]
      in_shape = tuple(operand.shape)
      if e.name == "reduce_window_max":
        groups = _window_groups(e, in_shape)
      else:
        groups = _reduce_groups(e, in_shape)
      nonneg = operand in self.nonneg and sgn > 0
      src = _MaxSource([operand], sgn)
    levels, final = _tournament(groups)
    if not levels:  # every window has one element: an affine gather
      def gather(*vals, src=src, final=final):
        return [jnp.reshape(src(dict(zip(src.vars, vals)))[final], out_shape)]
      self.segments[-1].steps.append(_Step(e.name, list(src.vars), [out], gather,
                                           ("gather", _index_key(final), out_shape,
                                            src.sgn, src.shape)))
      self.define([out], nonneg=nonneg)
      return
    for k, (a, b, odd) in enumerate(levels):
      last = k == len(levels) - 1
      dst = out if last else _Tmp((a.size + odd.size,), f"{e.name}[level {k}]")
      level = _MaxLevel(src, a, b, odd, nonneg, dst, (final, sgn, out_shape) if last else None)
      self.boundary(i, [level], e, {dst: out_shape if last else dst.shape})
      src = _MaxSource([dst])
    if nonneg:
      self.nonneg.add(out)

  def check_affine(self, e) -> None:
    """Raises unless ``e`` (which reads an input-dependent value) is affine in those values."""
    name = e.name
    dep = [self.is_dep(a) for a in e.invars]
    if name in _ORDER_PRIMITIVES:
      raise _function_error(
          f"primitive '{name}' is not encodable (the MILP encodes affine maps, ReLU, clipping "
          "and max/min pooling)", e)
    if name in _BILINEAR_PRIMITIVES:
      if sum(dep) != 1:
        raise _function_error(
            f"'{name}' of two input-dependent values is a product, not an affine map", e)
      return
    if name == "div":
      if dep[1]:
        raise _function_error("'div' by an input-dependent value is not affine", e)
      return
    if name == "integer_pow" and e.params.get("y") == 1:
      return
    if name in _LINEAR_PRIMITIVES:
      for a, d in zip(e.invars, dep):
        if d and not _is_float(a.aval.dtype):
          raise _function_error(
              f"'{name}' uses an input-dependent value as an index or predicate (not affine)", e)
      if name == "convert_element_type" and not jnp.issubdtype(e.params["new_dtype"],
                                                                jnp.floating):
        raise _function_error(
            f"'convert_element_type' to {e.params['new_dtype']} (rounding) is not affine", e)
      return
    raise _function_error(
        f"primitive '{name}' is not affine; only affine maps (dense, conv, scaling, reshapes, "
        "adds, ...), ReLU, clipping and max pooling can be encoded", e)


def _bind_f64(eqn, values: list) -> list:
  """Evaluates ``eqn`` with every floating operand and result in float64."""
  if isinstance(eqn, _Step):
    return eqn.bind(values)
  params = dict(eqn.params)
  if eqn.name == "convert_element_type" and jnp.issubdtype(params["new_dtype"], jnp.floating):
    params["new_dtype"] = np.dtype(np.float64)
  pet = params.get("preferred_element_type")
  if pet is not None and jnp.issubdtype(pet, jnp.floating):
    params["preferred_element_type"] = np.dtype(np.float64)
  return dataclasses.replace(eqn, params=params).bind([_f64(v) for v in values])


def _segment_fn(seg: _Segment, program, input_shape: tuple[int, ...], const_vars: list):
  """``fn(s, const_values, start_constants, end_constants)``: the segment from the flat state ``s``
  (input or ReLU outputs) to the next layer's flat pre-activations (or the output), in float64.
  Everything that is not structure is an argument, so one compilation serves every segment with
  the same `_segment_key` (e.g. the 45 ACAS Xu networks)."""
  from boundjax.core.ir import Lit

  def fn(s, const_values, cs_start, cs_end):
    consts = dict(zip(const_vars, const_values))
    env = ({program.invars[0]: jnp.reshape(s, input_shape)} if seg.start is None
           else seg.start.post(s, cs_start))
    for e in seg.steps:
      vals = [a.val if isinstance(a, Lit) else env[a] if a in env else consts[a]
              for a in e.invars]
      for v, o in zip(e.outvars, _bind_f64(e, vals)):
        env[v] = _f64(o)
    if seg.end is None:
      return jnp.reshape(_f64(env[program.outvars[0]]), (-1,))
    return seg.end.pre(env, cs_end)

  return fn


def _segment_key(seg: _Segment, program, input_shape: tuple[int, ...], const_vars: list,
                 consts: dict) -> tuple | None:
  """A hashable description of everything `_segment_fn` closes over (primitives, parameters,
  literals, which values flow where, index arrays, shapes), or None if some part is not
  hashable. Values are numbered by first use, so structurally equal segments of different
  networks get equal keys."""
  from boundjax.core.ir import Lit
  slots: dict = {}

  def slot(v) -> int:
    return slots.setdefault(v, len(slots))

  const_index = {v: i for i, v in enumerate(const_vars)}
  key: list = [("input", input_shape, slot(program.invars[0])) if seg.start is None
               else tuple(p.key(slot) for p in seg.start.parts)]
  for e in seg.steps:
    ops = []
    for a in e.invars:
      if isinstance(a, Lit):
        val = np.asarray(a.val)
        ops.append(("lit", str(val.dtype), val.shape, val.tobytes()))
      elif a in const_index:
        c = consts[a]
        ops.append(("const", const_index[a], tuple(np.shape(c)), str(jnp.result_type(c))))
      else:
        ops.append(("slot", slot(a)))
    if isinstance(e, _Step):
      if not e.key:
        return None
      head = e.key
    else:
      head = (e.prim, tuple(sorted(e.params.items())))
    key.append((head, tuple(ops), tuple(slot(o) for o in e.outvars)))
  key.append(("output", slot(program.outvars[0])) if seg.end is None
             else tuple(p.key(slot) for p in seg.end.parts))
  key = tuple(key)
  try:
    hash(key)
  except TypeError:
    return None
  return key


_COMPILED: dict = {}  # segment key -> (values, tangents), jitted; the oldest go first
_COMPILED_MAX = 256


def _compiled(fn, key: tuple | None):
  """Jitted ``values(S, *dyn) = [fn(s, *dyn) for s in S]`` and ``tangents(T, *dyn)`` (forward-mode
  derivatives at 0 along the rows of ``T``), cached by the segment key."""
  if key is not None and key in _COMPILED:
    return _COMPILED[key]

  def tangents(T, *dyn):
    zero = jnp.zeros(T.shape[1:], T.dtype)
    return jax.vmap(lambda t: jax.jvp(lambda s: fn(s, *dyn), (zero,), (t,))[1])(T)

  pair = (jax.jit(jax.vmap(fn, in_axes=(0, None, None, None))), jax.jit(tangents))
  if key is not None:
    while len(_COMPILED) >= _COMPILED_MAX:
      _COMPILED.pop(next(iter(_COMPILED)))
    _COMPILED[key] = pair
  return pair


def _segment_layer(seg: _Segment, program, consts: dict, input_shape: tuple[int, ...],
                   n_in: int, sparse_threshold: float, rng: np.random.Generator,
                   max_entries: int = 1 << 22) -> AffineLayer:
  """The exact affine layer of an affine segment ``f``: ``b = f(0)`` and column ``j`` of ``W``
  the directional derivative of ``f`` along ``e_j`` (forward mode), which for an affine ``f`` is
  ``f(e_j) - f(0)`` without the cancellation error of that subtraction. Affinity is checked at
  random points: ``f(p) = W p + b`` to ``1e-9`` relative."""
  from boundjax.core.ir import Lit
  const_vars = list(dict.fromkeys(
      a for e in seg.steps for a in e.invars
      if not isinstance(a, Lit) and a in consts and a not in program.depends))
  dyn = (tuple(consts[v] for v in const_vars),
         tuple(jnp.asarray(c) for c in (seg.start.constants if seg.start else [])),
         tuple(jnp.asarray(c) for c in (seg.end.constants if seg.end else [])))
  fn = _segment_fn(seg, program, input_shape, const_vars)
  values_fn, tangents_fn = _compiled(fn, _segment_key(seg, program, input_shape, const_vars,
                                                      consts))
  # f at 0 and at random points (scale 1 and 100), in one batch
  probes = np.concatenate([np.zeros((1, n_in)), rng.uniform(-1, 1, (3, n_in)),
                           rng.uniform(-100, 100, (2, n_in))])
  values = np.asarray(values_fn(jnp.asarray(probes), *dyn), np.float64)
  b, got, probes = values[0], values[1:], probes[1:]
  n_out = b.size
  chunk = max(1, min(n_in, max_entries // max(n_out, 1)))
  rows, cols, vals = [], [], []
  for start in range(0, n_in, chunk):
    stop = min(n_in, start + chunk)
    basis = np.zeros((chunk, n_in))  # always `chunk` rows: one compilation
    basis[np.arange(stop - start), np.arange(start, stop)] = 1.0
    block = np.asarray(tangents_fn(jnp.asarray(basis), *dyn), np.float64)[:stop - start]
    j, i = np.nonzero(block)  # block[j] is column start + j of W
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
    names = sorted({e.name for e in seg.steps})
    raise _function_error(
        "a segment between ReLUs is not affine in its input (evaluating it at random points "
        f"disagrees with its linearisation); its primitives: {', '.join(names)}")
  return AffineLayer.point(w, b)


def from_function(apply_fn, params: Any, input_shape: Sequence[int], output: str | None = None,
                  *, sparse_threshold: float = 0.25, check: bool = True,
                  seed: int = 0) -> Network:
  """A `Network` from any JAX function ``x -> apply_fn(params, x)`` made of affine maps, ReLU,
  clipping and max pooling (an imported ONNX graph, a Flax model's ``apply``, plain ``jnp`` code).

  The function is traced once (`boundjax.core.program.flatten` inlines every call, including
  ``jax.nn.relu``'s ``custom_jvp_call``) with ``params`` cast to float64; equations that do not
  depend on ``x`` (e.g. folding batch-norm statistics) are evaluated as constants. The
  ``x``-dependent equations become ReLU layers at:

  * every activation ``max(z, c)`` / ``min(z, c)`` / ``clamp`` with a constant ``c`` (``c = 0``:
    ReLU; in general ``c ± relu(±(z - c))``, so clipping is encoded too);
  * every max (or min) of input-dependent values: ``reduce_window_max`` (max pooling),
    ``reduce_max``/``reduce_min``, ``max(a, b)``: a tournament of layers with
    ``max(a, b) = relu(a - b) + b``, exact;
  * and values read again after such a layer (skip connections, parallel branches) are carried
    through it as ``v = relu(v) - relu(-v)`` (``relu(v)`` when ``v >= 0`` by construction, e.g.
    after a ReLU), so any such DAG becomes a chain. A plain chain gets exactly one layer per
    ReLU and nothing carried.

  Each segment between layers must be affine: only affine primitives may occur (dense, conv,
  products and quotients by constants, reshape/transpose/pad/slice/concatenate/gather, sums,
  average pooling, ...) and the segment ``f`` is checked numerically against its matrix. Its
  layer is ``b = f(0)``, ``W[:, j] = D f(0) e_j`` (the forward-mode derivative, equal to
  ``f(e_j) - f(0)`` for affine ``f`` but without that subtraction's cancellation), all in float64;
  floating casts inside the function (e.g. to float32) are evaluated in float64, so the network
  is the function in real arithmetic with its (float32-valued) parameters.

  Args:
    apply_fn: ``apply_fn(params, x) -> outputs`` (one array; its flattening ``.reshape(-1)`` is
      the network output).
    params: the parameter pytree; `Interval` leaves (or one `Interval` over parameter trees)
      make a hyper-network, whose layers are bounded over the box (`_box_network`).
    input_shape: the shape of ``x``, including any batch axis the function expects, e.g.
      ``(1, 1, 1, 5)`` for ACAS Xu ONNX models or ``(1, 784)``. The network's input is
      ``x.reshape(-1)`` (row-major), and ``Network.input_shape`` is ``input_shape``.
    output: ``"logits"``, ``"sign"`` or ``None`` (see `Network`).
    sparse_threshold: layers with fewer non-zeros than this fraction are stored as CSR.
    check: also replay random inputs through ``apply_fn`` (float64 parameters) and require
      agreement (``1e-5`` relative; the function may compute in float32 internally).
    seed: for the random check points.

  Raises:
    ValueError: naming the first primitive that cannot be encoded and the user's source line,
      e.g. ``tanh``, ``argmax``, a product of two input-dependent values, or a division by one.
  """
  from boundjax.core.program import evaluate_concrete, flatten, mark_dependence

  input_shape = tuple(int(s) for s in input_shape)
  if isinstance(params, Interval):  # one Interval over parameter trees
    params = join_tree(*split_tree(params))
  if any(is_interval(l) for l in jax.tree_util.tree_leaves(params, is_leaf=is_interval)):
    return _box_network(apply_fn, params, input_shape, output, sparse_threshold, check, seed)
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
    segments = _Compiler(program, consts).compile()
    layers = []
    n_in = int(np.prod(input_shape))
    for seg in segments:
      layer = _segment_layer(seg, program, consts, input_shape, n_in, sparse_threshold, rng)
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


class _BoxCompiler(_Compiler):
  """`_Compiler` for a function with interval parameters: its structure is read at the box's
  midpoint, so a value that depends on the parameters may be a factor of an affine step (it
  is bounded later) but never a structural constant (a clip bound), and it is non-negative for
  the carrying of skip values only where its sound lower bound over the box is."""

  def __init__(self, program, consts: dict, box_lower: dict):
    super().__init__(program, consts)
    self.box_lower = box_lower

  def constant(self, a: Any) -> np.ndarray | None:
    if isinstance(a, self.Var) and a in self.box_lower:
      raise _function_error("a clip bound or another structural constant depends on an "
                            "interval parameter")
    return super().constant(a)

  def operand_nonneg(self, a: Any) -> bool:
    if isinstance(a, self.Var) and a in self.box_lower:
      low = self.box_lower[a]
      return not _is_float(low) or bool(np.all(np.asarray(low, np.float64) >= 0))
    return super().operand_nonneg(a)


def _box_network(apply_fn, params: Any, input_shape: tuple[int, ...], output: str | None,
                 sparse_threshold: float, check: bool, seed: int,
                 max_entries: int = 1 << 22) -> Network:
  """`from_function` with `Interval` parameter leaves (a hyper-network; Sphynx, §4).

  The function is traced with the interval leaves as arguments and cut into segments at the
  box's midpoint (`_BoxCompiler`). Every layer ``(W_m, b_m)`` is then a JAX function of the
  parameters (`_segment_fn`'s value at 0 and its derivatives along the basis), bounded over the
  box by ``bj.ibp(..., sound=True)`` in float64: an enclosure of the layer of every member, in
  exact arithmetic. For Dense and Conv layers it is the kernel's box itself (each entry is one
  kernel entry times 1), rounded outward by at most an ulp.
  """
  from boundjax.core.ir import Lit
  from boundjax.core.program import evaluate_concrete, flatten, mark_dependence
  from boundjax.core.transforms import ibp

  leaves, treedef = jax.tree_util.tree_flatten(params, is_leaf=is_interval)
  boxes = [i for i, l in enumerate(leaves) if is_interval(l)]
  if not all(_is_float(leaves[i].lower) for i in boxes):
    raise ValueError("from_function: interval parameters must be floating-point.")
  with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
    fixed = [None if is_interval(a) else
             np.asarray(a, np.float64) if _is_float(a) and not isinstance(a, float) else a
             for a in leaves]
    lows = [np.asarray(leaves[i].lower, np.float64) for i in boxes]
    highs = [np.asarray(leaves[i].upper, np.float64) for i in boxes]
    mids = [l / 2 + h / 2 for l, h in zip(lows, highs)]
    box = [Interval(l, h) for l, h in zip(lows, highs)]

    def fn(x, *values):
      full = list(fixed)
      for i, v in zip(boxes, values):
        full[i] = v
      return apply_fn(jax.tree_util.tree_unflatten(treedef, full), x)

    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(
        jax.ShapeDtypeStruct(input_shape, jnp.float64),
        *[jax.ShapeDtypeStruct(m.shape, jnp.float64) for m in mids])
    if len(jax.tree_util.tree_leaves(out_shape)) != 1:
      raise ValueError("from_function: the function must return one array, got "
                       f"{jax.tree_util.tree_structure(out_shape)}.")
    program = flatten(closed, recognise=None)
    by_params = set(mark_dependence(program, [False] + [True] * len(boxes)).depends)
    program = mark_dependence(program, [True] + [False] * len(boxes))
    varying = [v for v in dict.fromkeys(list(program.invars[1:]) + [
        o for e in program.eqns for o in e.outvars]) if v in by_params and v not in program.depends]

    def constants(*values):
      env = evaluate_concrete(program, [None] + list(values))
      return [env[v] for v in varying]

    lower = ({v: lower_of(c) for v, c in zip(varying, jax.jit(ibp(constants, sound=True))(*box))}
             if varying else {})
    consts = {v: _f64(a) for v, a in evaluate_concrete(program, [None] + mids).items()}
    segments = _BoxCompiler(program, consts, lower).compile()

    plans = []
    for seg in segments:
      const_vars = list(dict.fromkeys(
          a for e in seg.steps for a in e.invars
          if not isinstance(a, Lit) and a in consts and a not in program.depends))
      plans.append((_segment_fn(seg, program, input_shape, const_vars), const_vars,
                    tuple(jnp.asarray(c) for c in (seg.start.constants if seg.start else [])),
                    tuple(jnp.asarray(c) for c in (seg.end.constants if seg.end else []))))

    def layers(*values):
      env = evaluate_concrete(program, [None] + list(values))
      out, n_in = [], _size(input_shape)
      for seg_fn, const_vars, cs_start, cs_end in plans:
        dyn = (tuple(env[v] for v in const_vars), cs_start, cs_end)
        zero = jnp.zeros((n_in,), jnp.float64)
        b = seg_fn(zero, *dyn)
        step = max(1, min(n_in, max_entries // max(int(b.size), 1)))
        blocks = [jax.vmap(lambda t: jax.jvp(lambda z: seg_fn(z, *dyn), (zero,), (t,))[1])(
            jnp.eye(n_in, dtype=jnp.float64)[start:start + step])
            for start in range(0, n_in, step)]
        out.append((jnp.concatenate(blocks, axis=0), b))  # (n_in, n_out), (n_out,)
        n_in = int(b.size)
      return out

    bounded = jax.jit(ibp(layers, sound=True))(*box)
  result = []
  for w, b in bounded:
    w_lo, w_hi = (np.asarray(f(w), np.float64).T.copy() for f in (lower_of, upper_of))
    b_lo, b_hi = (np.asarray(f(b), np.float64) for f in (lower_of, upper_of))
    if not all(np.all(np.isfinite(a)) for a in (w_lo, w_hi, b_lo, b_hi)):
      raise _function_error("a layer has non-finite weight or bias bounds over the box")
    nonzero = (w_lo != 0) | (w_hi != 0)
    if np.count_nonzero(nonzero) < sparse_threshold * max(w_lo.size, 1):
      w_lo, w_hi = sp.csr_array(w_lo), sp.csr_array(w_hi)
    result.append(AffineLayer(w_lo, w_hi, b_lo, b_hi))
  net = Network(tuple(result), input_shape, output)
  if check:  # the function at the box's ends and midpoint lies in the hyper-network's outputs
    probes = np.random.default_rng(seed).uniform(-1.0, 1.0, (3,) + input_shape)
    lo, hi = _output_hull(net, probes.reshape(len(probes), -1))  # one hull for every member
    for values in (lows, mids, highs):
      full = list(fixed)
      for i, v in zip(boxes, values):
        full[i] = v
      p64 = jax.tree_util.tree_unflatten(treedef, full)
      with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
        ref = np.stack([np.asarray(apply_fn(p64, jnp.asarray(x)), np.float64).reshape(-1)
                        for x in probes])
      tol = 1e-6 * (1 + np.abs(ref).max())
      if ref.shape != lo.shape or np.any(ref < lo - tol) or np.any(ref > hi + tol):
        raise _function_error("the extracted hyper-network does not contain the function at "
                              "its parameter box's ends; please report this with the function")
  return net


# -- the affine view as a JAX function (what the engine bounds: `milp.bounds`) -----------------

Params = list[tuple[Any, Any]]


def affine_chain(params: Params, x: jax.Array) -> list[jax.Array]:
  """The `Network`'s affine view as a JAX function: ``[z_1, ..., z_L]`` with
  ``z_m = W_m h_{m-1} + b_m``, ``h_0 = x``, ``h_m = max(z_m, 0)`` (no ReLU after the last)."""
  outs, h = [], x
  for m, (w, b) in enumerate(params):
    z = jnp.dot(w, h) + b
    outs.append(z)
    if m < len(params) - 1:
      h = jnp.maximum(z, 0.0)
  return outs


def _leaf(lo: np.ndarray, hi: np.ndarray) -> Any:
  """A float64 array, or an `Interval` where the two ends differ (a hyper-network's parameter)."""
  if np.array_equal(lo, hi):
    return jnp.asarray(lo)
  return Interval(jnp.asarray(lo), jnp.asarray(hi))


def layer_params(layer: AffineLayer) -> tuple[Any, Any]:
  """``(W, b)`` of one layer as float64 engine leaves (call under ``jax.enable_x64(True)``)."""
  return (_leaf(np.asarray(_dense(layer.w_lower), np.float64),
                np.asarray(_dense(layer.w_upper), np.float64)),
          _leaf(np.asarray(layer.b_lower, np.float64), np.asarray(layer.b_upper, np.float64)))


def network_params(net: Network) -> Params:
  """Every layer's `layer_params` (call under ``jax.enable_x64(True)``)."""
  return [layer_params(l) for l in net.layers]


def _output_hull(net: Network, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The (hyper-)network's output bounds at each row of ``xs`` (a point input: the hull over its
  parameter box), by the engine's sound float64 interval pass over `affine_chain`."""
  from boundjax.core.transforms import ibp
  with jax.enable_x64(True):
    params = network_params(net)
    bound = jax.jit(ibp(lambda p, x: affine_chain(p, x)[-1], sound=True, matmul="best"))
    outs = [bound(params, Interval(jnp.asarray(x), jnp.asarray(x)))
            for x in np.asarray(xs, np.float64)]
    return (np.stack([np.asarray(lower_of(o), np.float64) for o in outs]),
            np.stack([np.asarray(upper_of(o), np.float64) for o in outs]))
