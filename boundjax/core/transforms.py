"""The three bound transformations side by side: `ibp` (here), `crown` (the linear domain,
`boundjax.domains.linear`) and `difference` (difference intervals, `boundjax.domains.difference`).

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
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.core import program as prog_lib
from boundjax.domains import interval as interval_domain
from boundjax.domains.difference import difference  # noqa: F401  (re-exported: bj.difference)
from boundjax.domains.linear import crown  # noqa: F401  (re-exported: bj.crown)
from boundjax.core.interval import Interval, validate_arguments


def ibp(fn: Callable, *, matmul: str = "midrad", sound: bool = False,
        memory_bytes: int = 1 << 30) -> Callable:
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
    memory_bytes: the budget of one ``matmul="exact"`` product's temporaries (it materialises
      every term; its rows are bounded in chunks that fit). The other forms need a few arrays of
      the sizes ``fn`` itself computes.

  Returns:
    A function with ``fn``'s signature whose outputs are `Interval`s wherever they depend on an
    `Interval` argument.

  Raises:
    BoundError: an invalid box (lower > upper, NaN, infinite, complex, mixed dtypes) or a NaN in a
      concrete argument, named with the caller's line.
    UnsupportedPrimitiveError: a primitive without an interval rule, with the user's source line.
    MemoryBudgetError: one row of an "exact" product does not fit ``memory_bytes``.
  """
  if not isinstance(sound, bool):
    raise ValueError(f"ibp: sound must be a bool, got {sound!r}")
  ctx = interval_domain.IntervalContext(matmul=matmul, sound=sound, memory_bytes=memory_bytes)
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
    outs = prog_lib.check_outputs(outs, where="bj.ibp", program=program, nan_free=True)
    return jax.tree_util.tree_unflatten(program.out_tree, outs)

  return bounded


def _affine(w: jax.Array, b: jax.Array, x: jax.Array) -> jax.Array:
  return x @ w.T + b


_sound_affine = jax.jit(ibp(_affine, sound=True, matmul="signsplit"))


def affine_image(w, b, lower, upper):
  """Sound float64 bounds ``(lo, hi)`` of ``x W^T + b`` over every box ``lower <= x <= upper``
  (rows of ``lower``/``upper`` are separate boxes; numpy in, numpy out): `ibp` in sound mode, so
  the bounds hold for the exact product (Higham, §3.1). The one place where a front-end that
  holds numpy matrices (a MILP's last layer, a specification's rows, a first layer) gets the
  image of a box."""
  lower, upper = np.asarray(lower, np.float64), np.asarray(upper, np.float64)
  single = lower.ndim == 1
  lower, upper = np.atleast_2d(lower), np.atleast_2d(upper)
  rows = lower.shape[0]
  pad = max(8, 1 << (rows - 1).bit_length()) - rows     # a few shapes, a few compilations
  lower, upper = (np.pad(v, ((0, pad), (0, 0))) for v in (lower, upper))
  with jax.enable_x64(True):
    f64 = lambda v: jnp.asarray(np.asarray(v, np.float64))  # noqa: E731
    out = _sound_affine(f64(w), f64(b), Interval(f64(lower), f64(upper), validate=False))
    lo, hi = np.asarray(out.lower)[:rows], np.asarray(out.upper)[:rows]
  return (lo[0], hi[0]) if single else (lo, hi)
