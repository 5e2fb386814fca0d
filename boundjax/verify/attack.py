"""Falsifier: sampling and projected gradient descent for counterexamples, replayed in float64.

For a disjunct ``C y <= d`` the loss ``g(x) = max_i (C_i f(x) - d_i)`` is <= 0 exactly at the
counterexamples. The attack minimises it over the box by projected sign-gradient descent (PGD,
Madry et al. 2018) from the box centre, corners (small inputs) and uniform random points, all
restarts of all disjuncts batched in one jitted ``vmap``; step sizes shrink geometrically.
Candidates are checked by a float64 replay (`Replayer`): only a point whose float64 outputs
satisfy every row of a disjunct is returned.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.verify.outcome import Deadline
from boundjax.verify.spec import Region

F64 = np.float64


def _cast(tree: Any, dtype) -> Any:
  return jax.tree_util.tree_map(
      lambda a: np.asarray(a, dtype) if np.issubdtype(np.asarray(a).dtype, np.floating)
      else np.asarray(a), tree)


class Replayer:
  """Evaluates the network in float64 on flattened inputs: ``apply_fn`` under x64 with the
  parameters cast to float64 (the network the user gave, at double precision)."""

  def __init__(self, apply_fn: Callable, params: Any, input_shape: Sequence[int]):
    self.input_shape = tuple(input_shape)
    with jax.enable_x64(True):
      self.params = _cast(params, np.float64)
      self._fn = jax.jit(jax.vmap(lambda p, x: jnp.reshape(
          apply_fn(p, jnp.reshape(x, self.input_shape)), (-1,)), in_axes=(None, 0)))

  def __call__(self, xs: np.ndarray) -> np.ndarray:
    xs = np.asarray(xs, np.float64).reshape(len(xs), -1)
    with jax.enable_x64(True):
      return np.asarray(self._fn(self.params, jnp.asarray(xs)), np.float64)

  def find(self, region: Region, xs: np.ndarray):
    """The first ``(x, y)`` among ``xs`` (clipped to the box in float64) whose replayed outputs
    satisfy a disjunct of ``region``, or None."""
    if len(xs) == 0:
      return None
    xs = np.clip(np.asarray(xs, np.float64).reshape(len(xs), -1), region.lower, region.upper)
    ys = self(xs)
    for c in region.disjuncts:
      hit = np.nonzero(c.violated_by(ys))[0]
      if hit.size:
        return xs[hit[0]], ys[hit[0]]
    return None


def start_points(region: Region, n: int, rng: np.random.Generator) -> np.ndarray:
  """Centre, corners (inputs of dimension <= 10) and uniform points: (m, dim) with m >= n."""
  lo, hi = region.lower, region.upper
  pts = [(lo + hi) / 2]
  if region.dim <= 10:
    pts += [np.where(np.array(bits, bool), hi, lo) for bits in itertools.product((0, 1),
                                                                               repeat=region.dim)]
  pts = np.array(pts)
  extra = max(n - len(pts), 0)
  return np.concatenate([pts, rng.uniform(lo, hi, size=(extra, region.dim))])


@functools.partial(jax.jit, static_argnames=("fn", "steps", "shape"))
def _pgd(fn, params, x0, lo, hi, C, d, steps: int, shape):
  """Sign-PGD on ``max_i (C_i f(x) - d_i)`` from every start ``x0`` (n, dim), one disjunct."""
  def loss(x):
    y = jnp.reshape(fn(params, jnp.reshape(x, shape)), (-1,))
    return jnp.max(C @ y - d)

  grad = jax.vmap(jax.value_and_grad(loss))
  width = hi - lo

  def step(carry, t):
    x, best_x, best_v = carry
    v, g = grad(x)
    better = v < best_v
    best_x = jnp.where(better[:, None], x, best_x)
    best_v = jnp.where(better, v, best_v)
    eta = 0.25 * width * (0.02 / 0.25) ** (t / max(steps - 1, 1))
    x = jnp.clip(x - eta * jnp.sign(g), lo, hi)
    return (x, best_x, best_v), None

  init = (x0, x0, jnp.full(x0.shape[:1], jnp.inf, x0.dtype))
  (x, best_x, best_v), _ = jax.lax.scan(step, init, jnp.arange(steps, dtype=x0.dtype))
  v = jax.vmap(loss)(x)
  better = v < best_v
  return jnp.where(better[:, None], x, best_x), jnp.minimum(v, best_v)


def falsify(apply_fn: Callable, params: Any, input_shape: Sequence[int],
            regions: Sequence[Region], replay: Replayer, deadline: Deadline, *,
            restarts: int = 64, steps: int = 50, rounds: int = 1, key: int = 0):
  """Sampling then PGD on every disjunct of every region until the deadline; returns ``(x, y)``
  (float64, replayed) or None. ``rounds`` repeats PGD with fresh random starts."""
  rng = np.random.default_rng(key)
  dtype = np.float32
  p32 = _cast(params, dtype)
  shape = tuple(input_shape)
  for region in regions:  # cheap sampling first
    hit = replay.find(region, start_points(region, 4 * restarts, rng))
    if hit is not None:
      return hit
  for r in range(rounds):
    for region in regions:
      lo, hi = region.lower.astype(dtype), region.upper.astype(dtype)
      x0 = start_points(region, restarts, rng)[-restarts:] if r else start_points(
          region, restarts, rng)[:restarts]
      for c in region.disjuncts:
        if deadline.expired():
          return None
        xs, _ = _pgd(apply_fn, p32, jnp.asarray(x0, dtype), lo, hi, jnp.asarray(c.C, dtype),
                     jnp.asarray(c.d, dtype), steps, shape)
        hit = replay.find(region, np.asarray(xs))
        if hit is not None:
          return hit
  return None


def jacobians(Ws: Sequence[np.ndarray], bs: Sequence[np.ndarray], xs: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
  """Outputs ``y`` (n, out) and Jacobians ``J`` (n, out, dim) of a ReLU chain at points ``xs``
  (n, dim), float64: on the linear piece containing ``x`` (the ReLU pattern at ``x``, a
  neuron at exactly 0 counted inactive) ``f(x') = y + J (x' - x)``."""
  h = np.asarray(xs, F64)
  J = np.broadcast_to(np.eye(h.shape[1]), (len(h), h.shape[1], h.shape[1]))
  for i, (w, b) in enumerate(zip(Ws, bs)):
    h = h @ w.T + b
    J = np.einsum("oi,nid->nod", w, J)
    if i < len(Ws) - 1:
      on = h > 0
      h = np.where(on, h, 0.0)
      J = J * on[:, :, None]
  return h, J



def lp_step(C: np.ndarray, d: np.ndarray, y: np.ndarray, J: np.ndarray, x: np.ndarray,
            lo: np.ndarray, hi: np.ndarray) -> np.ndarray | None:
  """One step of the local search: the minimiser over ``x'`` in ``[lo, hi]`` of
  ``max_i C_i (y + J (x' - x)) - d_i`` (an LP in ``(x', t)``, HiGHS through scipy), or None.

  On the linear piece around ``x`` this is the network's own ``max_i C_i f(x') - d_i``, so a
  negative optimum inside the piece is a counterexample (the LP-based local search of
  falsifiers for piecewise-linear networks, e.g. the linear-region walk of Reluplex's
  successors; the answer is only a candidate, replayed in float64 by the caller)."""
  from scipy.optimize import linprog
  n = x.size
  A = np.concatenate([C @ J, -np.ones((C.shape[0], 1))], axis=1)
  b = d - C @ (y - J @ x)
  cost = np.zeros(n + 1)
  cost[-1] = 1.0
  bounds = [(float(a), float(c)) for a, c in zip(lo, hi)] + [(None, None)]
  res = linprog(cost, A_ub=A, b_ub=b, bounds=bounds, method="highs")
  return res.x[:n] if res.status == 0 else None


def local_search(Ws: Sequence[np.ndarray], bs: Sequence[np.ndarray], region: Region,
                 starts: np.ndarray, replay: Replayer, deadline: Deadline, *,
                 iters: int = 12, radius: float = 0.05):
  """LP local search for a counterexample from each start (inputs of small dimension).

  For each start and disjunct: linearise the network at the point (`jacobians`), minimise the
  disjunct's loss ``max_i C_i f - d_i`` over a trust box of half-width ``radius × width``
  around it (`lp_step`), move there if the true loss decreased (else shrink the trust box by
  4), ``iters`` times. Points whose float64 loss is <= 0 are replayed (`Replayer.find`).
  Sign-PGD stalls where the violating set is a thin sliver between linear pieces (ACAS Xu 1_9
  prop_7 comes within 4e-4 of a violation); the LP reaches the piece's exact minimum. Returns
  ``(x, y)`` or None."""
  lo, hi = region.lower, region.upper
  width = hi - lo
  for dj in region.disjuncts:
    def loss(xs):
      y, _ = jacobians(Ws, bs, xs)
      return np.max(y @ dj.C.T - dj.d, axis=1)
    for x in np.atleast_2d(starts):
      r = radius
      x = np.clip(x, lo, hi)
      v = loss(x[None])[0]
      for _ in range(iters):
        if deadline.expired():
          return None
        y, J = jacobians(Ws, bs, x[None])
        nxt = lp_step(dj.C, dj.d, y[0], J[0], x, np.maximum(lo, x - r * width),
                      np.minimum(hi, x + r * width))
        if nxt is None:
          break
        nxt = np.clip(nxt, lo, hi)
        vn = loss(nxt[None])[0]
        if vn <= 0:
          hit = replay.find(region, nxt[None])
          if hit is not None:
            return hit
        if vn < v:
          x, v = nxt, vn
        else:
          r /= 4
          if r * float(np.max(width)) < 1e-12:
            break
  return None


def sample_search(Ws: Sequence[np.ndarray], bs: Sequence[np.ndarray], region: Region,
                  replay: Replayer, deadline: Deadline, *, samples: int = 1_000_000,
                  chunk: int = 50_000, top: int = 32, key: int = 0):
  """Uniform sampling of the box in float32 (chunks of ``chunk`` points, up to ``samples`` or
  three quarters of the time), then `local_search` (float64) from the ``top`` points of lowest loss
  ``min_disjunct max_i C_i f(x) - d_i``. For violations too small for PGD's basins: on ACAS Xu
  1_9 prop_7 one point in 10^6 lands within 5e-6 of the violating sliver and the LP from it
  reaches it. Returns ``(x, y)`` or None."""
  rng = np.random.default_rng(key)
  best_v, best_x = np.empty(0), np.empty((0, region.dim))
  done = 0
  reserve = 0.25 * deadline.remaining()  # kept for the local search
  W32 = [np.asarray(w, np.float32) for w in Ws]
  b32 = [np.asarray(b, np.float32) for b in bs]
  while done < samples and deadline.remaining() > reserve:
    xs = rng.uniform(region.lower, region.upper, size=(chunk, region.dim))
    h = xs.astype(np.float32)
    for i, (w, b) in enumerate(zip(W32, b32)):
      h = h @ w.T + b
      if i < len(Ws) - 1:
        h = np.maximum(h, 0.0)
    h = h.astype(np.float64)
    v = np.min([np.max(h @ dj.C.T - dj.d, axis=1) for dj in region.disjuncts], axis=0)
    if np.any(v <= 0):
      hit = replay.find(region, xs[v <= 0])
      if hit is not None:
        return hit
    best_v, best_x = np.concatenate([best_v, v]), np.concatenate([best_x, xs])
    keep = np.argsort(best_v)[:top]
    best_v, best_x = best_v[keep], best_x[keep]
    done += chunk
  return local_search(Ws, bs, region, best_x, replay, deadline)
