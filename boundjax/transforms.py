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
import time
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


# ----------------------------------------------------------------------------------------------
# Demo (the "bounds" section of `boundjax demo`)
# ----------------------------------------------------------------------------------------------

def demo_section(eps_list: tuple[float, ...] = (0.005, 0.01, 0.02, 0.05), steps: int = 300,
                 n_samples: int = 200, seed: int = 0) -> str:
  """Certified-robust accuracy with IBP and CROWN on scikit-learn's breast_cancer.

  Trains an MLP 30-32-32-2 (ReLU, Adam, full batch) on the min-max scaled training split, then for
  every ``eps`` bounds the logits over the L∞ ball of radius ``eps`` (clipped to [0, 1]) around
  each test example. An example is *certified robust* when it is classified correctly and the
  lower bound of its true logit exceeds the upper bound of the other one. Reports the
  certified-robust accuracy of IBP and CROWN, the time each bound took (jitted, compilation
  excluded), and the number of sampled points of the boxes found outside a bound (must be 0).
  """
  import optax
  import flax.linen as nn
  from boundjax.data import load_sklearn
  from boundjax.models import fit_full_batch

  class _MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = nn.relu(nn.Dense(32)(x))
      x = nn.relu(nn.Dense(32)(x))
      return nn.Dense(2)(x)

  data = load_sklearn("breast_cancer", seed=seed)
  x_tr, y_tr = jnp.asarray(data.x_train), jnp.asarray(data.y_train)
  x, y = jnp.asarray(data.x_test), jnp.asarray(data.y_test)
  model = _MLP()
  params = fit_full_batch(model.apply, model.init(jax.random.PRNGKey(seed), x_tr[:1]), x_tr, y_tr,
                          optax.adam(3e-3), steps)
  logits = model.apply(params, x)
  correct = jnp.argmax(logits, -1) == y
  onehot = jax.nn.one_hot(y, 2, dtype=bool)
  methods = {"IBP": jax.jit(ibp(model.apply)), "CROWN": crown(model.apply)}

  def robust(out):
    true_lo = jnp.sum(jnp.where(onehot, out.lower, 0.0), -1)
    other_hi = jnp.max(jnp.where(onehot, -jnp.inf, out.upper), -1)
    return float(jnp.mean(correct & (true_lo > other_hi)))

  lines = [f"bounds demo: MLP 30-32-32-2 on breast_cancer ({len(y)} test examples, "
           f"clean accuracy {float(jnp.mean(correct)):.3f})",
           "certified-robust accuracy over the L-inf ball of radius eps; time of one bound call "
           "for the whole test set (jitted, compilation excluded, median of 5)",
           f"{'eps':>7} " + " ".join(f"{m + ' acc':>10} {m + ' time':>11}" for m in methods)]
  violations = 0
  for i, eps in enumerate(eps_list):
    box = Interval.around(x, eps, domain=(0.0, 1.0))
    cells = []
    pts = box.lower + box.width * jax.random.uniform(jax.random.PRNGKey(seed + i),
                                                     (n_samples, *box.shape))
    vals = jax.vmap(lambda p: model.apply(params, p))(pts)
    for fn in methods.values():
      out = jax.block_until_ready(fn(params, box))  # compile
      times = []
      for _ in range(5):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(params, box))
        times.append(time.perf_counter() - t0)
      seconds = float(np.median(times))
      tol = 1e-5 * (1 + jnp.abs(vals))  # float32 rounding of the sampled forward passes
      violations += int(jnp.sum((vals < out.lower - tol) | (vals > out.upper + tol)))
      cells.append(f"{robust(out):>10.3f} {seconds * 1e3:>9.1f}ms")
    lines.append(f"{eps:>7.3f} " + " ".join(cells))
  n_checked = n_samples * len(eps_list) * len(methods) * logits.size
  lines.append(f"sampled logits outside their bound (violations, must be 0): {violations} of "
               f"{n_checked}")
  return "\n".join(lines)
