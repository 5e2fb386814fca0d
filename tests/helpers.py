"""Shared test utilities: sampling concrete points from boxes and checking containment."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import boundjax as bj


def sample_box(key, box: bj.Interval, n: int, vertex_fraction: float = 0.5):
  """``n`` points of ``box``: a share at random vertices (where bounds are attained), rest uniform."""
  k1, k2, k3 = jax.random.split(key, 3)
  shape = (n,) + box.shape
  uniform = jax.random.uniform(k1, shape, dtype=box.dtype, minval=box.lower, maxval=box.upper)
  corner = jnp.where(jax.random.bernoulli(k2, 0.5, shape), box.upper, box.lower)
  use_corner = jax.random.bernoulli(k3, vertex_fraction, (n,) + (1,) * box.ndim)
  return jnp.where(use_corner, corner, uniform)


def sample_tree(key, tree, n: int, vertex_fraction: float = 0.5):
  """Samples every Interval leaf of ``tree`` (``n`` draws, leading axis); arrays are broadcast."""
  leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=bj.is_interval)
  keys = jax.random.split(key, len(leaves))
  out = []
  for k, leaf in zip(keys, leaves):
    if isinstance(leaf, bj.Interval):
      out.append(sample_box(k, leaf, n, vertex_fraction))
    else:
      leaf = jnp.asarray(leaf)
      out.append(jnp.broadcast_to(leaf, (n,) + leaf.shape))
  return jax.tree_util.tree_unflatten(treedef, out)


def assert_inside(bound, values, tol: float = 1e-5, what: str = "") -> int:
  """Asserts every sampled value (leading sample axis) lies in ``bound``; returns the count."""
  values = np.asarray(values)
  lo = np.asarray(bj.interval.lower_of(bound))
  hi = np.asarray(bj.interval.upper_of(bound))
  scale = tol * (1.0 + np.abs(values))
  below = values < lo - scale
  above = values > hi + scale
  bad = below | above
  if bad.any():
    i = tuple(np.argwhere(bad)[0])
    raise AssertionError(
        f"{what}: {int(bad.sum())} of {bad.size} sampled values outside the bound; first at {i}: "
        f"value {values[i]!r} not in [{lo[i[1:]]!r}, {hi[i[1:]]!r}]")
  return values.shape[0]
