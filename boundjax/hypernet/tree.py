"""Hyper-networks as pytrees of `Interval`s: flattening, the exact hull of a family (LUCID,
Def. 5.1), containment, and output bounds with `bj.ibp`."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.core.interval import Interval, is_interval, tree_contains
from boundjax.core.transforms import ibp

PyTree = Any
#: A hyper-network: a parameter pytree whose leaves are `Interval` s (array leaves are points).
HyperNetwork = Any


# ---------------------------------------------------------------------------------------------
# Pytree plumbing
# ---------------------------------------------------------------------------------------------

def interval_leaves(hyper: PyTree) -> list[Interval]:
  """The Interval leaves of a hyper-network, in pytree order."""
  return [l for l in jax.tree_util.tree_leaves(hyper, is_leaf=is_interval) if is_interval(l)]


def flatten_params(params: PyTree) -> np.ndarray:
  """All parameters of one network as a ``(P,)`` vector (pytree leaf order)."""
  return np.concatenate([np.asarray(l).ravel() for l in jax.tree_util.tree_leaves(params)])


def flatten_stacked(stacked: PyTree) -> np.ndarray:
  """Stacked networks (leading member axis) as an ``(M, P)`` matrix (pytree leaf order)."""
  leaves = [np.asarray(l) for l in jax.tree_util.tree_leaves(stacked)]
  m = leaves[0].shape[0]
  if any(l.shape[0] != m for l in leaves):
    raise ValueError("stacked parameters disagree on the member axis size.")
  return np.concatenate([l.reshape(m, -1) for l in leaves], axis=1)


def flat_bounds(hyper: PyTree) -> tuple[np.ndarray, np.ndarray]:
  """``(lower, upper)`` vectors of a hyper-network; array leaves count as points."""
  leaves = jax.tree_util.tree_leaves(hyper, is_leaf=is_interval)
  lo = [np.asarray(l.lower if is_interval(l) else l).ravel() for l in leaves]
  hi = [np.asarray(l.upper if is_interval(l) else l).ravel() for l in leaves]
  return np.concatenate(lo), np.concatenate(hi)


def _outward(lo: np.ndarray, hi: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray]:
  """Casts float64 bounds to ``dtype`` rounding ``lo`` down and ``hi`` up.

  ``lo_c = cast(lo)``, then ``lo_c = nextafter(lo_c, -inf)`` where ``lo_c > lo`` (the
  round-to-nearest cast went inward), and symmetrically for ``hi``; compared in float64, so
  ``lo_c <= lo`` and ``hi_c >= hi`` exactly, at most one ulp of ``dtype`` looser than needed.
  """
  dtype = np.dtype(dtype)
  lo_c, hi_c = lo.astype(dtype), hi.astype(dtype)
  lo_c = np.where(lo_c.astype(np.float64) > lo, np.nextafter(lo_c, dtype.type(-np.inf)), lo_c)
  hi_c = np.where(hi_c.astype(np.float64) < hi, np.nextafter(hi_c, dtype.type(np.inf)), hi_c)
  return lo_c, hi_c


def _device_dtype(dtype) -> np.dtype:
  """The dtype ``jnp.asarray`` gives an array of ``dtype`` (float64 -> float32 without x64)."""
  return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def _sound_interval(lo: np.ndarray, hi: np.ndarray) -> Interval:
  """``Interval(lo, hi)`` on the device, rounded outward if the device dtype is narrower.

  ``jnp.asarray`` rounds to nearest: with jax x64 disabled a float64 minimum can round up and a
  maximum down, leaving the very points the box was built from outside it (LUCID Def. 5.1
  needs containment). Floating bounds are therefore cast with `_outward`; others pass as is.
  """
  target = _device_dtype(lo.dtype)
  if np.issubdtype(lo.dtype, np.floating) and target != lo.dtype:
    lo, hi = _outward(np.asarray(lo, np.float64), np.asarray(hi, np.float64), target)
  return Interval(jnp.asarray(lo, target), jnp.asarray(hi, target))


def from_flat_bounds(lower: np.ndarray, upper: np.ndarray, like: PyTree) -> PyTree:
  """A hyper-network shaped like the parameters ``like`` from ``(P,)`` bound vectors.

  Bounds are rounded outward to each leaf's dtype as JAX stores it (float64 leaves become
  float32 when x64 is disabled), so containment survives the cast.
  """
  leaves, treedef = jax.tree_util.tree_flatten(like)
  sizes = [int(np.size(l)) for l in leaves]
  if lower.shape != (sum(sizes),) or upper.shape != lower.shape:
    raise ValueError(f"bounds have shapes {lower.shape}, {upper.shape}; the template has "
                     f"{sum(sizes)} parameters.")
  out, start = [], 0
  for leaf, size in zip(leaves, sizes):
    a = np.asarray(leaf)
    target = _device_dtype(a.dtype)
    lo, hi = _outward(np.asarray(lower[start:start + size], np.float64),
                      np.asarray(upper[start:start + size], np.float64), target)
    out.append(Interval(jnp.asarray(lo.reshape(a.shape), target),
                        jnp.asarray(hi.reshape(a.shape), target)))
    start += size
  return jax.tree_util.tree_unflatten(treedef, out)


# ---------------------------------------------------------------------------------------------
# Exact hyper-network (LUCID Def. 5.1) and containment
# ---------------------------------------------------------------------------------------------

def from_ensemble(stacked: PyTree, members: Optional[Sequence[int] | np.ndarray] = None) -> PyTree:
  """Coordinate-wise ``[min, max]`` over members (LUCID, Def. 5.1).

  Args:
    stacked: parameters with a leading member axis (e.g. ``Ensemble.params``).
    members: row indices (or a boolean mask) to abstract; default all rows.

  Returns:
    A pytree like one member whose leaves are `Interval` s. The hull is computed in the members'
    own dtype and, where JAX stores it narrower (float64 members with x64 disabled become
    float32), rounded outward: ``lower = round_down(min_n w^n)``, ``upper = round_up(max_n w^n)``,
    so every member lies in the box when compared in its own precision.
  """
  def hull(a):
    a = np.asarray(a)
    sel = a if members is None else a[np.asarray(members)]
    if sel.shape[0] == 0:
      raise ValueError("from_ensemble: no members selected.")
    return _sound_interval(sel.min(axis=0), sel.max(axis=0))

  return jax.tree_util.tree_map(hull, stacked)


def point(params: PyTree) -> PyTree:
  """The point hyper-network ``[w, w]`` of one network (Sphynx's interval abstraction of one network)."""
  return jax.tree_util.tree_map(Interval.point, params)


def contains(hyper: PyTree, params: PyTree, tol: float = 0.0) -> bool:
  """True iff every parameter of the network ``params`` lies in its interval of ``hyper``."""
  return tree_contains(hyper, params, tol)


def contains_members(hyper: PyTree, stacked: PyTree, tol: float = 0.0) -> np.ndarray:
  """``(M,)`` booleans: which rows of the stacked networks lie entirely in ``hyper``."""
  lo, hi = flat_bounds(hyper)
  w = flatten_stacked(stacked)
  return np.all((w >= lo - tol) & (w <= hi + tol), axis=1)


def jaccard(a: tuple[np.ndarray, np.ndarray], b: Optional[tuple[np.ndarray, np.ndarray]]
            ) -> np.ndarray:
  """Per-parameter Jaccard index ``|I ⊓ I'| / |I ⊔ I'|`` (Sphynx's stopping condition, Alg. 1 line 5).

  ``a`` and ``b`` are ``(lower, upper)`` vectors. ``J(·, ⊥) = 0`` (``b is None``) and two equal
  points have ``J = 1``.
  """
  al, au = (np.asarray(v, np.float64) for v in a)
  if b is None:
    return np.zeros_like(al)
  bl, bu = (np.asarray(v, np.float64) for v in b)
  inter = np.maximum(0.0, np.minimum(au, bu) - np.maximum(al, bl))
  hull = np.maximum(au, bu) - np.minimum(al, bl)
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(hull > 0, inter / np.where(hull > 0, hull, 1.0), 1.0)


# ---------------------------------------------------------------------------------------------
# Output bounds
# ---------------------------------------------------------------------------------------------

def hyper_output_bounds(apply_fn: Callable, hyper: PyTree, x: Any) -> Any:
  """Bounds on ``apply_fn(θ, x')`` for every ``θ`` in ``hyper`` and ``x'`` in ``x`` (an array or
  an `Interval` box): ``bj.ibp(apply_fn)(hyper, x)``.
  """
  return ibp(apply_fn)(hyper, x)
