"""Local Lipschitz constants of a network over an L∞ box, in the ∞→1 norm a Laplace release needs.

For a function ``f : R^q -> R^m`` and the box ``N(z, r) = {z' : ||z' - z||_inf <= r}`` the local
Lipschitz constant (PTR, App. A, Lemma A.1; LipMIP: Jordan & Dimakis 2020) is

    L(f, N) = sup_{a != b in N} ||f(a) - f(b)||_1 / ||a - b||_inf
            = sup_{z' in N} sup_{G in Clarke Jacobian at z'} ||G||_{inf->1},

    ||G||_{inf->1} = max_{c in {±1}^m} ||G^T c||_1 = max_{c, s} c^T G s,

exact by enumerating the ``2^(m-1)`` sign vectors ``c`` up to ``c -> -c``. The ℓ1 output norm is
the one the Laplace mechanism is calibrated in (per-coordinate Laplace noise, PTR, App. B).

Oracles (``upper`` is always a sound upper bound, ``lower`` an attained value):

* ``"ibp"`` — the FastLip-style bound (Weng et al. 2018): interval bounds of the ReLU activation
  pattern over the box, then, for each sign vector ``c``, the interval of ``J(z')^T c`` by a
  backward interval pass through the layer Jacobians; ``U = max_c sum_j max(|γ_lo_j|, |γ_hi_j|)``.
  It is computed by `boundjax.ibp` of the vector-Jacobian product ``z -> J(z)^T c``, so it applies
  to any JAX function (every primitive with an interval rule), runs under ``jit``/``vmap`` and, with
  ``sound=False``, is differentiable in the weights (a training regulariser). Inclusion-monotone:
  a smaller box gives a smaller bound.
* ``"ibp_cheap"`` — one forward interval pass of the full Jacobian ``[J_lo, J_hi]`` and
  ``U = sum_{k,j} max(|J_lo|, |J_hi|)_{kj} >= ||J||_{inf->1}``; no enumeration of ``c`` (large m).
* ``"enumerate"`` — one hidden layer ``f = W2 relu(W1 z + b1) + b2`` only: every activation
  pattern of the IBP-unstable units, each pattern's Jacobian norm exactly, patterns checked for
  realisability in the box by a linear program (largest value first, so usually one LP). Exact when
  the best pattern is realisable on an open set.
* the exact MILP (LipMIP's formulation) is in `milp.lipschitz` (this package cannot import `milp`).

``out_norm="linf_as_code"`` gives ``||G||_{inf->inf} = max_i ||G_{i,:}||_1`` instead: the value the
PTR authors' code computes (LipMIP with an ℓ1-ball ``c``), which is up to ``m`` times smaller than
the ∞→1 constant the ℓ1 Laplace release needs. It exists only to reproduce the paper's numbers.

Lower bounds: the Jacobian norm at sampled points of the box (uniform, the centre, the corners for
``q <= 10``), refined by projected sign-gradient ascent of ``||J(z)^T c||_1`` (PGD), with the point
that attains the maximum (``argmax``). For a ReLU network the Jacobian is piecewise constant, so
PGD moves only smooth networks; the sampled points carry the bound there.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.core.interval import Interval
from boundjax.core.transforms import affine_image, ibp

Array = jax.Array
ApplyFn = Callable[[Any, Array], Array]

METHODS = ("ibp", "ibp_cheap", "enumerate")
OUT_NORMS = ("l1", "linf_as_code")
MAX_SIGN_OUTPUTS = 16   # 2^15 sign vectors; beyond this use "ibp_cheap"


@dataclasses.dataclass(frozen=True)
class LipschitzBound:
  """A local Lipschitz constant over a box, bracketed.

  Attributes:
    upper: sound upper bound (>= the true constant in the chosen norm).
    lower: a value the constant attains or exceeds (a Jacobian norm at ``argmax``).
    method: the oracle that gave ``upper``.
    exact: ``upper`` and ``lower`` agree (to ``1e-9`` relative), so ``upper`` is the constant.
    argmax: the point of the box where ``lower`` is attained (flat, float64), or ``None``.
    out_norm: ``"l1"`` (∞→1) or ``"linf_as_code"`` (∞→∞).
    seconds: wall-clock time of the call.
  """

  upper: float
  lower: float
  method: str
  exact: bool
  argmax: np.ndarray | None = None
  out_norm: str = "l1"
  seconds: float = 0.0


# ------------------------------------------------------------------------------------------------
# Norms
# ------------------------------------------------------------------------------------------------

def sign_vectors(m: int, dtype: Any = jnp.float32) -> Array:
  """The ``2^(m-1)`` vectors of ``{±1}^m`` with first entry ``+1`` (one of each pair ``±c``)."""
  if m < 1:
    raise ValueError(f"sign_vectors: need m >= 1, got {m}.")
  bits = (np.arange(2 ** (m - 1))[:, None] >> np.arange(m - 1)[None, :]) & 1
  rest = 1.0 - 2.0 * bits
  return jnp.asarray(np.concatenate([np.ones((2 ** (m - 1), 1)), rest], axis=1), dtype)


def output_directions(m: int, out_norm: str = "l1", dtype: Any = jnp.float32) -> Array:
  """Vectors ``c`` with ``||G||_norm = max_c ||G^T c||_1``: sign vectors (∞→1), or the unit
  vectors ``e_i`` (∞→∞, the rows of ``G``)."""
  check_out_norm(out_norm)
  if out_norm == "linf_as_code":
    return jnp.eye(m, dtype=dtype)
  if m > MAX_SIGN_OUTPUTS:
    raise ValueError(f"the inf->1 norm enumerates 2^(m-1) sign vectors; m = {m} outputs is more "
                     f"than {MAX_SIGN_OUTPUTS}: use method='ibp_cheap'.")
  return sign_vectors(m, dtype)


def operator_norm(jac: Any, out_norm: str = "l1") -> Array:
  """``||J||_{inf->1}`` (or ``||J||_{inf->inf}``) of Jacobians ``(..., m, q)``, exactly."""
  jac = jnp.asarray(jac)
  if out_norm == "linf_as_code":
    return jnp.max(jnp.sum(jnp.abs(jac), axis=-1), axis=-1)
  c = output_directions(jac.shape[-2], out_norm, jac.dtype)
  return jnp.max(jnp.sum(jnp.abs(jnp.einsum("km,...mq->...kq", c, jac)), axis=-1), axis=-1)


def check_out_norm(out_norm: str) -> None:
  if out_norm not in OUT_NORMS:
    raise ValueError(f"out_norm must be one of {OUT_NORMS}, got {out_norm!r}.")


def check_radius(radius: Any) -> None:
  """Raises for a negative or non-finite concrete radius (traced radii are not checked)."""
  if isinstance(radius, jax.core.Tracer):
    return
  r = np.asarray(radius, np.float64)
  if not np.all(np.isfinite(r)) or np.any(r < 0):
    raise ValueError(f"radius must be finite and >= 0, got {radius!r}.")


# ------------------------------------------------------------------------------------------------
# IBP-Jacobian bounds (FastLip-style)
# ------------------------------------------------------------------------------------------------

def _flat(apply_fn: ApplyFn, shape: tuple[int, ...]) -> Callable[[Any, Array], Array]:
  """``(params, z_flat) -> apply_fn(params, z).reshape(-1)``."""
  return lambda params, z: jnp.reshape(apply_fn(params, jnp.reshape(z, shape)), (-1,))


def _cached(builder: Callable, *args: Any) -> Callable:
  """``builder(*args)`` from an LRU cache; built afresh when an argument is unhashable."""
  try:
    return builder(*args)
  except TypeError:
    return builder.__wrapped__(*args)


def _ends(v: Any) -> tuple[Array, Array]:
  """``(lower, upper)`` of an `Interval`, or ``(v, v)`` for a value that does not depend on the
  box (a linear function's Jacobian)."""
  return (v.lower, v.upper) if isinstance(v, Interval) else (v, v)


def outward_sum_factor(n: int, dtype: Any) -> float:
  """``1 + 2 n u``: bounds the rounding of a sum of ``n`` non-negative terms from above."""
  return 1.0 + 2.0 * (n + 1) * float(jnp.finfo(dtype).eps)


def ibp_upper(apply_fn: ApplyFn, params: Any, center: Any, radius: Any, *, method: str = "ibp",
              out_norm: str = "l1", sound: bool = True) -> Array:
  """The IBP-Jacobian upper bound on ``L(f, N(center, radius))`` as a JAX scalar.

  Pure JAX: usable under ``jit`` and ``vmap`` (over ``center`` and ``radius``) and, with
  ``sound=False``, under ``grad`` in ``params`` (FastLip, Weng et al. 2018, as a regulariser).

  Args:
    apply_fn: ``apply_fn(params, z) -> outputs`` (any JAX function; outputs flattened).
    params: its parameters (concrete arrays).
    center: the box centre (any shape; flattened for the norms).
    radius: the L∞ radius (>= 0).
    method: ``"ibp"`` (per sign vector, FastLip) or ``"ibp_cheap"`` (one interval Jacobian).
    out_norm: ``"l1"`` (∞→1) or ``"linf_as_code"`` (∞→∞).
    sound: round every interval step outward (`boundjax.ibp(..., sound=True)`), so the bound holds
      in real arithmetic; not differentiable. ``False``: plain float bounds, differentiable.
  """
  check_out_norm(out_norm)
  if method not in ("ibp", "ibp_cheap"):
    raise ValueError(f"ibp_upper: method must be 'ibp' or 'ibp_cheap', got {method!r}.")
  check_radius(radius)
  center = jnp.asarray(center)
  dtype = center.dtype if jnp.issubdtype(center.dtype, jnp.floating) else jnp.float32
  z = jnp.reshape(center, (-1,)).astype(dtype)
  f = _flat(apply_fn, center.shape)
  box = Interval(z - radius, z + radius, validate=False)
  q = z.size
  if method == "ibp_cheap":
    jac = ibp(lambda p, x: jax.jacfwd(lambda y: f(p, y))(x), sound=sound)(params, box)
    mag = jnp.maximum(*map(jnp.abs, _ends(jac)))
    if out_norm == "l1":
      value, terms = jnp.sum(mag), mag.size
    else:
      value, terms = jnp.max(jnp.sum(mag, axis=-1)), q
  else:
    m = jax.eval_shape(lambda: f(params, z)).shape[0]
    cs = output_directions(m, out_norm, dtype)
    vjp = lambda p, x, c: jax.vjp(lambda y: f(p, y), x)[1](c.astype(x.dtype))[0]
    gamma = jax.vmap(lambda c: ibp(vjp, sound=sound)(params, box, c))(cs)
    mag = jnp.maximum(*map(jnp.abs, _ends(gamma)))
    value, terms = jnp.max(jnp.sum(mag, axis=-1)), q
  return value * outward_sum_factor(terms, value.dtype) if sound else value


@functools.lru_cache(maxsize=64)
def _single(apply_fn: ApplyFn, method: str, out_norm: str, sound: bool):
  return jax.jit(lambda p, c, r: ibp_upper(apply_fn, p, c, r, method=method, out_norm=out_norm,
                                           sound=sound))


@functools.lru_cache(maxsize=64)
def _batched(apply_fn: ApplyFn, method: str, out_norm: str, sound: bool):
  fn = lambda p, c, r: ibp_upper(apply_fn, p, c, r, method=method, out_norm=out_norm, sound=sound)
  return jax.jit(jax.vmap(fn, in_axes=(None, 0, 0)))


def ibp_upper_batch(apply_fn: ApplyFn, params: Any, centers: Any, radii: Any, *,
                    method: str = "ibp", out_norm: str = "l1", sound: bool = True) -> Array:
  """`ibp_upper` for many boxes at once: ``centers`` ``(n, ...)``, ``radii`` scalar or ``(n,)``;
  one compiled ``vmap`` (cached per ``apply_fn``, method and norm)."""
  centers = jnp.asarray(centers)
  check_radius(radii)
  radii = jnp.broadcast_to(jnp.asarray(radii, centers.dtype), centers.shape[:1])
  return _cached(_batched, apply_fn, method, out_norm, sound)(params, centers, radii)


# ------------------------------------------------------------------------------------------------
# Lower bounds: sampled Jacobians and PGD
# ------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def _norms_fn(apply_fn: ApplyFn, shape: tuple[int, ...], out_norm: str) -> Callable:
  f = _flat(apply_fn, shape)
  jac = jax.vmap(lambda p, z: jax.jacfwd(lambda y: f(p, y))(z), in_axes=(None, 0))
  return jax.jit(lambda p, flat: operator_norm(jac(p, flat), out_norm))


def jacobian_norms(apply_fn: ApplyFn, params: Any, points: Any, out_norm: str = "l1") -> Array:
  """``||J(z)||`` at each of ``points`` ``(n, ...)`` (exact in ``c``; ``jax.jacfwd``)."""
  points = jnp.asarray(points)
  fn = _cached(_norms_fn, apply_fn, tuple(points.shape[1:]), out_norm)
  return fn(params, jnp.reshape(points, (points.shape[0], -1)))


def _box_samples(key: Array, z: np.ndarray, radius: float, n: int) -> np.ndarray:
  """The centre, ``n`` uniform points and (for ``q <= 10``) every corner of the box."""
  rng = np.random.default_rng(np.asarray(jax.random.key_data(key)
                                         if jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
                                         else key, np.uint32).ravel().tolist())
  q = z.size
  pts = [z[None], z + radius * rng.uniform(-1.0, 1.0, (n, q))]
  if q <= 10:
    corners = np.array(list(itertools.product((-1.0, 1.0), repeat=q)))
    pts.append(z + radius * corners)
  return np.concatenate(pts)


def sampled_lower(apply_fn: ApplyFn, params: Any, center: Any, radius: float, *,
                  key: Array | None = None, n_samples: int = 1024, pgd_steps: int = 10,
                  pgd_starts: int = 8, out_norm: str = "l1") -> tuple[float, np.ndarray]:
  """A lower bound on ``L(f, N(center, radius))`` and the point attaining it.

  The Jacobian norm at the centre, ``n_samples`` uniform points and the corners (``q <= 10``);
  then ``pgd_steps`` of projected sign-gradient ascent of ``||J(z)^T c||_1`` from the
  ``pgd_starts`` best points, ``c`` the maximising direction at each start.
  """
  key = jax.random.PRNGKey(0) if key is None else key
  center = jnp.asarray(center)
  shape, dtype = center.shape, (center.dtype if jnp.issubdtype(center.dtype, jnp.floating)
                                else jnp.float32)
  z = np.asarray(center, np.float64).reshape(-1)
  pts = _box_samples(key, z, float(radius), n_samples)
  norms = np.asarray(jacobian_norms(apply_fn, params, jnp.asarray(pts, dtype).reshape(
      (-1,) + shape), out_norm), np.float64)
  best = int(np.argmax(norms))
  value, point = float(norms[best]), pts[best]
  if pgd_steps > 0 and radius > 0:
    starts = pts[np.argsort(-norms)[:pgd_starts]]
    v, p = _pgd(apply_fn, params, starts, z, float(radius), pgd_steps, out_norm, shape, dtype)
    if v > value:
      value, point = v, p
  return value, point


@functools.lru_cache(maxsize=64)
def _pgd_fn(apply_fn: ApplyFn, shape: tuple[int, ...], out_norm: str, steps: int) -> Callable:
  """Jitted PGD: ``(params, starts, lo, hi, radius) -> (best point, best norm)`` per start."""
  f = _flat(apply_fn, shape)

  def objective(p, x, c):
    return jnp.sum(jnp.abs(jax.vjp(lambda y: f(p, y), x)[1](c)[0]))

  def run(p, x0, lo, hi, radius):
    m = jax.eval_shape(lambda: f(p, x0)).shape[0]
    cs = output_directions(m, out_norm, x0.dtype)
    norm_at = lambda x: jnp.max(jax.vmap(lambda c: objective(p, x, c))(cs))
    c = cs[jnp.argmax(jax.vmap(lambda c: objective(p, x0, c))(cs))]

    def step(i, carry):
      x, bx, bv = carry
      g = jax.grad(objective, argnums=1)(p, x, c)
      x = jnp.clip(x + (radius / 4.0) * 0.7 ** i * jnp.sign(g), lo, hi)
      v = norm_at(x)
      return (x, jnp.where(v > bv, x, bx), jnp.maximum(v, bv))

    return jax.lax.fori_loop(0, steps, step, (x0, x0, norm_at(x0)))[1:]

  return jax.jit(jax.vmap(run, in_axes=(None, 0, None, None, None)))


def _pgd(apply_fn, params, starts, z, radius, steps, out_norm, shape, dtype):
  fn = _cached(_pgd_fn, apply_fn, tuple(shape), out_norm, int(steps))
  bx, bv = fn(params, jnp.asarray(starts, dtype), jnp.asarray(z - radius, dtype),
              jnp.asarray(z + radius, dtype), jnp.asarray(radius, dtype))
  i = int(jnp.argmax(bv))
  return float(bv[i]), np.asarray(bx[i], np.float64)


# ------------------------------------------------------------------------------------------------
# Pattern enumeration (one hidden layer) with LP pruning
# ------------------------------------------------------------------------------------------------

def one_hidden_layer(apply_fn: ApplyFn, params: Any, center: Any,
                     radius: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """``(W1, b1, W2)`` (float64, ``W`` as ``(out, in)``) of a two-Dense-layer ReLU network.

  The layers are read from ``params`` (`boundjax.models.dense_layers`); ``apply_fn`` must be
  ``W2 relu(W1 z + b1) + b2``, which is checked at points of the box.
  """
  from boundjax.models import dense_layers

  try:
    layers = dense_layers(params)
  except ValueError as e:
    raise ValueError(f"method='enumerate' needs a Dense ReLU network: {e}") from None
  if len(layers) != 2:
    raise ValueError(f"method='enumerate' handles one hidden layer; the network has "
                     f"{len(layers) - 1}. Use method='ibp' or the MILP (milp.lipschitz).")
  W1, b1 = (np.asarray(layers[0][k], np.float64) for k in ("kernel", "bias"))
  W2, b2 = (np.asarray(layers[1][k], np.float64) for k in ("kernel", "bias"))
  W1, W2 = W1.T, W2.T
  z = np.asarray(center, np.float64).reshape(-1)
  pts = z + radius * np.random.default_rng(0).uniform(-1, 1, (4, z.size))
  pts = np.concatenate([z[None], pts])
  want = np.maximum(pts @ W1.T + b1, 0.0) @ W2.T + b2
  shape = np.shape(center)
  got = np.stack([np.asarray(apply_fn(params, jnp.asarray(p.reshape(shape), jnp.asarray(center)
                                                                .dtype)), np.float64).reshape(-1)
                  for p in pts])
  if got.shape != want.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-5):
    raise ValueError("method='enumerate': apply_fn is not the ReLU network W2 relu(W1 z + b1) "
                     "+ b2 of params' two Dense layers (checked at points of the box).")
  return W1, b1, W2


def _pattern_values(W1: np.ndarray, W2: np.ndarray, fixed: np.ndarray, unstable: np.ndarray,
                    patterns: np.ndarray, out_norm: str) -> np.ndarray:
  """``||W2 diag(δ) W1||`` for every pattern (rows of ``patterns`` over the unstable units)."""
  cs = np.asarray(output_directions(W2.shape[0], out_norm, jnp.float64))   # (nc, m)
  V = W2.T @ cs.T                                        # (k, nc): rows W2[:, j]^T c
  base = W1[fixed].T @ V[fixed]                          # (q, nc)
  Wu, Vu = W1[unstable], V[unstable]                     # (u, q), (u, nc)
  out = np.empty(len(patterns))
  for s in range(0, len(patterns), 2048):
    P = patterns[s:s + 2048].astype(np.float64)
    gam = base[None] + np.einsum("pu,uq,uc->pqc", P, Wu, Vu)
    out[s:s + 2048] = np.abs(gam).sum(axis=1).max(axis=1)
  return out


def _pattern_margin(W1, b1, unstable, delta, lo, hi) -> tuple[float, np.ndarray]:
  """``max t`` s.t. ``±(w_j z + b_j) / ||w_j|| >= t`` (sign from ``δ_j``) over the box: ``t > 0``
  iff the pattern holds on an open subset of the box; the maximiser ``z``."""
  from scipy.optimize import linprog

  W, b = W1[unstable], b1[unstable]
  s = np.where(delta, 1.0, -1.0)
  nrm = np.maximum(np.linalg.norm(W, axis=1), 1e-300)
  # -s (w z + b)/||w|| + t <= 0
  A = np.concatenate([-(s / nrm)[:, None] * W, np.ones((len(W), 1))], axis=1)
  ub = s * b / nrm
  q = W1.shape[1]
  cost = np.zeros(q + 1)
  cost[-1] = -1.0
  scale = float(np.max(hi - lo)) + 1.0
  res = linprog(cost, A_ub=A, b_ub=ub, bounds=list(zip(lo, hi)) + [(-scale * 10, scale)],
                method="highs")
  if res.status != 0:
    return -math.inf, lo
  return float(res.x[-1]), np.asarray(res.x[:-1])


def enumerate_patterns(W1: np.ndarray, b1: np.ndarray, W2: np.ndarray, center: Any, radius: float,
                       *, out_norm: str = "l1", lp_prune: bool = True, max_unstable: int = 16,
                       tol: float = 1e-9) -> tuple[float, float, np.ndarray | None]:
  """``(upper, lower, argmax)`` for ``f = W2 relu(W1 z + b1) + b2`` over ``N(center, radius)``.

  Units IBP finds stable keep their derivative (1 or 0); every pattern of the ``u`` unstable units
  is scored ``max_c ||W1^T diag(δ) W2^T c||_1``. With ``lp_prune``, patterns are taken from the
  highest score down and each is tested by an LP (`_pattern_margin`): the first one realisable in
  the closed box (margin ``>= -tol``) is ``upper``; the first realisable on an open set (margin
  ``> tol``, a point where the Jacobian is that pattern's) is ``lower``, with its point. Without
  pruning, ``upper`` is the largest score and ``lower`` is ``-inf`` (the caller samples).
  """
  z = np.asarray(center, np.float64).reshape(-1)
  lo, hi = z - radius, z + radius
  # the exact box [z - r, z + r], rounded outward, and its sound image under the first layer
  pre_lo, pre_hi = affine_image(W1, b1, np.nextafter(lo, -np.inf), np.nextafter(hi, np.inf))
  fixed = pre_lo > 0
  unstable = np.flatnonzero(~fixed & (pre_hi > 0))
  if unstable.size > max_unstable:
    raise ValueError(f"enumerate: {unstable.size} unstable units (2^{unstable.size} patterns) "
                     f"exceed max_unstable={max_unstable}; use method='ibp' or the MILP.")
  patterns = ((np.arange(2 ** unstable.size)[:, None] >> np.arange(unstable.size)[None]) & 1
              ).astype(bool)
  values = _pattern_values(W1, W2, fixed, unstable, patterns, out_norm)
  pad = outward_sum_factor(W1.shape[0] * W1.shape[1], np.float64)
  if not lp_prune or unstable.size == 0:
    up = float(values.max()) * pad
    if unstable.size == 0:  # one linear piece: the constant is attained at the centre
      return up, float(values.max()), z
    return up, -math.inf, None
  upper = None
  for i in np.argsort(-values, kind="stable"):
    t, point = _pattern_margin(W1, b1, unstable, patterns[i], lo, hi)
    if t >= -tol and upper is None:
      upper = float(values[i]) * pad
    if t > tol:
      return upper, float(values[i]), point
  return (upper if upper is not None else 0.0), -math.inf, None


# ------------------------------------------------------------------------------------------------
# Entry point
# ------------------------------------------------------------------------------------------------

def local_lipschitz(apply_fn: ApplyFn, params: Any, center: Any, radius: float, *,
                    method: str = "ibp", out_norm: str = "l1", key: Array | None = None,
                    n_samples: int = 1024, pgd_steps: int = 10, sound: bool = True,
                    lp_prune: bool = True) -> LipschitzBound:
  """Sound local Lipschitz constant of ``z -> apply_fn(params, z)`` over ``N(center, radius)``.

  Args:
    apply_fn: ``apply_fn(params, z)``; for ``"enumerate"`` a two-Dense-layer ReLU network whose
      layers are ``params``.
    params: the parameters.
    center: the box centre ``z`` (any shape, flattened).
    radius: L∞ radius ``>= 0``.
    method: ``"ibp"``, ``"ibp_cheap"`` or ``"enumerate"`` (see the module docstring). The exact
      MILP and ``"auto"`` are `milp.lipschitz.local_lipschitz`.
    out_norm: ``"l1"`` (∞→1, what the ℓ1 Laplace release needs) or ``"linf_as_code"`` (∞→∞, the
      PTR authors' code).
    key: PRNG key for the sampled lower bound.
    n_samples, pgd_steps: effort of the lower bound.
    sound: outward rounding in the IBP methods.
    lp_prune: LP realisability checks in ``"enumerate"``.

  Raises:
    ValueError: a negative radius, an unknown method or norm, ``"milp"`` (lives in `milp`), or a
      network ``"enumerate"`` cannot handle.
  """
  t0 = time.perf_counter()
  check_out_norm(out_norm)
  check_radius(radius)
  if method in ("milp", "auto"):
    raise ValueError(f"method={method!r} is the MILP oracle: call milp.lipschitz.local_lipschitz "
                     "(boundjax cannot import milp).")
  if method not in METHODS:
    raise ValueError(f"method must be one of {METHODS}, got {method!r}.")
  radius = float(radius)
  lower, point = sampled_lower(apply_fn, params, center, radius, key=key, n_samples=n_samples,
                               pgd_steps=pgd_steps, out_norm=out_norm)
  if method == "enumerate":
    W1, b1, W2 = one_hidden_layer(apply_fn, params, center, radius)
    upper, lo_e, pt_e = enumerate_patterns(W1, b1, W2, center, radius, out_norm=out_norm,
                                           lp_prune=lp_prune)
    if lo_e > lower:
      lower, point = lo_e, pt_e
  else:
    center = jnp.asarray(center)
    upper = float(_cached(_single, apply_fn, method, out_norm, sound)(
        params, center, jnp.asarray(radius, center.dtype)))
  exact = upper - lower <= 1e-9 * max(1.0, abs(upper))
  return LipschitzBound(upper=upper, lower=lower, method=method, exact=bool(exact),
                        argmax=None if point is None else np.asarray(point, np.float64),
                        out_norm=out_norm, seconds=time.perf_counter() - t0)
