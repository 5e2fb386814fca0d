"""Shared test utilities: sampling concrete points from boxes and checking containment."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import boundjax as bj
from boundjax.core import interval as interval_lib


def _rng(key) -> np.random.Generator:
  """A NumPy generator seeded by a JAX key (deterministic, no compilation)."""
  if jnp.issubdtype(jnp.asarray(key).dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  return np.random.default_rng(np.asarray(key, dtype=np.uint32).ravel().tolist())


def sample_box(key, box: bj.Interval, n: int, vertex_fraction: float = 0.5):
  """``n`` points of ``box``: a share at random vertices (where bounds are attained), rest uniform.

  Drawn with NumPy (seeded by ``key``): eager ``jax.random`` compiles a new kernel for every
  sample shape, which costs seconds per shape on a CPU.
  """
  rng = _rng(key)
  lo, hi = np.asarray(box.lower, np.float64), np.asarray(box.upper, np.float64)
  shape = (n,) + lo.shape
  uniform = np.clip(lo + (hi - lo) * rng.random(shape), lo, hi)
  corner = np.where(rng.random(shape) < 0.5, hi, lo)
  use_corner = rng.random((n,) + (1,) * lo.ndim) < vertex_fraction
  return jnp.asarray(np.where(use_corner, corner, uniform), dtype=box.dtype)


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
  lo = np.asarray(interval_lib.lower_of(bound))
  hi = np.asarray(interval_lib.upper_of(bound))
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


def matmul_precisions(jaxpr) -> list:
  """The ``precision`` of every dot_general / conv_general_dilated in ``jaxpr`` and its
  sub-jaxprs (to check that sound modes emit ``Precision.HIGHEST``)."""
  found = []
  for e in jaxpr.eqns:
    if e.primitive.name in ("dot_general", "conv_general_dilated"):
      found.append(e.params["precision"])
    for sub in jax.extend.core.jaxprs_in_params(e.params):
      found += matmul_precisions(sub)
  return found


def mlp_apply(params, z):
  """A Dense+ReLU network given as a list of ``{"kernel", "bias"}`` layers (no ReLU at the end)."""
  h = z
  for i, layer in enumerate(params):
    h = h @ layer["kernel"] + layer["bias"]
    if i < len(params) - 1:
      h = jax.nn.relu(h)
  return h


def chain_apply(p, x):
  """A ReLU chain given as ``{"w": [W_0, ...], "b": [b_0, ...]}`` (``h <- W h + b``) on one
  flattened input, no ReLU at the end: the verifier tests' network."""
  h = jnp.reshape(x, (-1,))
  for k, (w, b) in enumerate(zip(p["w"], p["b"])):
    h = w @ h + b
    if k < len(p["w"]) - 1:
      h = jax.nn.relu(h)
  return h


def random_mlp(seed, sizes):
  """Layers for `mlp_apply` with entries ``U(-1, 1) / sqrt(fan_in)``."""
  rng = np.random.default_rng(seed)
  return [{"kernel": jnp.asarray(rng.uniform(-1, 1, (a, b)) / np.sqrt(a)),
           "bias": jnp.asarray(rng.uniform(-1, 1, b) / np.sqrt(a))}
          for a, b in zip(sizes[:-1], sizes[1:])]


def gaussian_blobs(n, d=4, classes=2, seed=0, sep=1.5):
  """``n`` points of ``classes`` Gaussian blobs in ``d`` dimensions (unit spread, centres ~ N(0, sep^2))."""
  rng = np.random.default_rng(seed)
  y = rng.integers(0, classes, n)
  centres = rng.normal(size=(classes, d)) * sep
  X = centres[y] + rng.normal(size=(n, d))
  return jnp.asarray(X), jnp.asarray(y)


def fast_subset(names, fast, always_slow: bool = False) -> list:
  """``names`` as pytest parameters, those outside ``fast`` (all of them if ``always_slow``)
  marked ``slow``: a variant test (low precision, integer operands, infinite entries) runs in
  CI on a few representative rules of every family and on every rule in the slow suite
  (``bash scripts/test.sh --slow``), which keeps CI within its time budget."""
  import pytest
  return [n if (n in fast and not always_slow) else pytest.param(n, marks=pytest.mark.slow)
          for n in names]
