"""Bounds as function transformations: `ibp` (and `crown`, re-exported from the linear domain).

``bj.ibp(fn)`` returns a function with ``fn``'s signature. Wherever a pytree leaf of an argument
is an `Interval` instead of an array, the result encloses every value ``fn`` takes when that
leaf ranges over its box; outputs that do not depend on any box stay arrays.

Mechanics: `boundjax.core.program` traces ``fn`` at stand-ins of the argument shapes and dtypes
into one flat program (every call inlined, composites recognised by identity), and the interval
domain's rule table bounds every box-dependent equation. Python scalars and other non-array
leaves (strings, ``None``, flags) are static.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.core import program as prog_lib
from boundjax.domains import interval as interval_domain
from boundjax.interval import Interval, is_interval
from boundjax.validation import validate_arguments


def ibp(fn: Callable, *, matmul: str = "midrad", sound: bool = False) -> Callable:
  """Interval bound propagation of ``fn``.

  Args:
    fn: any JAX-traceable function (a Flax ``model.apply``, an optax loss, a plain function).
      Every `Interval` leaf of its arguments ranges over its box independently of every other
      leaf (the same object passed twice is two variables); array leaves are concrete; Python
      scalars and other non-array leaves are static (baked into the trace).
    matmul: how a product of two boxes is bounded in dot_general/conv ("midrad", "signsplit",
      "exact", "best"; see `boundjax.domains.interval.IntervalContext`). Products with a
      concrete operand are always exact.
    sound: round every bound outward so it holds in exact arithmetic, and run every matrix
      product at ``precision=HIGHEST`` (no TF32 on accelerators).

  Returns:
    A function with ``fn``'s signature whose outputs are `Interval`s wherever they depend on an
    `Interval` argument.

  Raises:
    BoundError: an invalid box (lower > upper, NaN, infinite, complex, mixed dtypes) or a NaN in a
      concrete argument, named with the caller's line.
    UnsupportedPrimitiveError: a primitive without an interval rule, with the user's source line.
  """
  ctx = interval_domain.IntervalContext(matmul=matmul, sound=sound)
  cache: dict = {}

  @functools.wraps(fn)
  def bounded(*args, **kwargs):
    arguments = prog_lib.split_arguments(args, kwargs)
    validate_arguments(arguments.leaves, where="bj.ibp")
    key = arguments.cache_key()
    program = cache.get(key) if key is not None else None
    if program is None:
      program = prog_lib.trace(fn, arguments, precision_highest=sound)
      if key is not None and len(cache) < 32:
        cache[key] = program
    outs = interval_domain.evaluate(program, arguments.dynamic, ctx)
    outs = prog_lib.check_outputs(outs, where="bj.ibp")
    return jax.tree_util.tree_unflatten(program.out_tree, outs)

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
