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

from milp.complete.outcome import Deadline
from milp.complete.spec import Region


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
