"""Bounds as function transformations: `ibp` (and `crown`, re-exported from the linear domain).

``bj.ibp(fn)`` returns a function with ``fn``'s signature. Wherever a pytree leaf of an argument
is an `Interval` instead of an array, the result encloses every value ``fn`` takes when that
leaf ranges over its box; outputs that do not depend on any box stay arrays.

Mechanics: ``fn`` is traced to a jaxpr at stand-in values of the same shapes and dtypes (the
lower endpoints), and the jaxpr is evaluated by `boundjax.interpreter` with the interval domain.
Non-array leaves (strings, ``None``, Python flags) are passed through statically.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from boundjax import interpreter
from boundjax.domains import interval as interval_domain
from boundjax.interval import Interval, is_interval
from boundjax.nn import COMPOSITES

_DOMAIN = interval_domain.make_domain(COMPOSITES)


def _is_array_like(x: Any) -> bool:
  return isinstance(x, (jax.Array, np.ndarray, np.generic, float, int, bool, complex)) or (
      isinstance(x, jax.core.Tracer))


def split_args(args: tuple, kwargs: dict):
  """Flattens ``(args, kwargs)`` into dynamic leaves (arrays, Intervals) and static ones.

  Returns ``(dynamic, rebuild)`` where ``rebuild(values)`` puts values for the dynamic leaves
  back into the original structure.
  """
  leaves, treedef = jax.tree_util.tree_flatten((args, kwargs), is_leaf=is_interval)
  dyn_index = [i for i, l in enumerate(leaves) if is_interval(l) or _is_array_like(l)]
  dynamic = [leaves[i] for i in dyn_index]

  def rebuild(values):
    new = list(leaves)
    for i, v in zip(dyn_index, values):
      new[i] = v
    return jax.tree_util.tree_unflatten(treedef, new)

  return dynamic, rebuild


def trace(fn: Callable, args: tuple, kwargs: dict):
  """Traces ``fn`` with every Interval leaf replaced by an array of its shape and dtype.

  Returns ``(closed_jaxpr, dynamic_leaves, out_treedef)``.
  """
  dynamic, rebuild = split_args(args, kwargs)
  _check_intervals(dynamic)
  stand_ins = [d.lower if is_interval(d) else d for d in dynamic]

  def flat_fn(*values):
    a, k = rebuild(values)
    return fn(*a, **k)

  closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*stand_ins)
  out_tree = jax.tree_util.tree_structure(out_shape)
  return closed, dynamic, out_tree


def _check_intervals(dynamic) -> None:
  for d in dynamic:
    if is_interval(d):
      if jnp.shape(d.lower) != jnp.shape(d.upper):
        raise ValueError(
            f"Interval argument has lower shape {jnp.shape(d.lower)} but upper shape "
            f"{jnp.shape(d.upper)}.")
      if jnp.result_type(d.lower) != jnp.result_type(d.upper):
        raise ValueError(
            f"Interval argument has lower dtype {jnp.result_type(d.lower)} but upper dtype "
            f"{jnp.result_type(d.upper)}.")


def ibp(fn: Callable, *, matmul: str = "midrad", sound: bool = False) -> Callable:
  """Interval bound propagation of ``fn``.

  Args:
    fn: any JAX-traceable function (a Flax ``model.apply``, an optax loss, a plain function).
    matmul: how a product of two boxes is bounded in dot_general/conv ("midrad", "signsplit",
      "exact", "best"; see `boundjax.domains.interval.IntervalContext`). Products with a
      concrete operand are always exact.
    sound: round every bound outward so it holds in exact arithmetic (costs a few extra
      element-wise operations and one extra product per bilinear op).

  Returns:
    A function with ``fn``'s signature whose outputs are `Interval`s wherever they depend on an
    `Interval` argument.
  """
  ctx = interval_domain.IntervalContext(matmul=matmul, sound=sound)

  @functools.wraps(fn)
  def bounded(*args, **kwargs):
    closed, dynamic, out_tree = trace(fn, args, kwargs)
    outs = interpreter.evaluate(_DOMAIN, ctx, closed, *dynamic)
    return jax.tree_util.tree_unflatten(out_tree, outs)

  return bounded


def crown(fn: Callable, **options) -> Callable:
  """Linear (CROWN) bound propagation; see `boundjax.domains.linear.crown`."""
  from boundjax.domains import linear
  return linear.crown(fn, **options)
