"""Pre-activation bounds (big-M constants) of a `Network` over an input box: calls to the engine.

Every bound here comes from `boundjax` (``bj.ibp`` / ``bj.crown`` through the program layer), in
float64 and **sound mode**: the engine rounds each bound outward by the a-priori error of the
float64 evaluation (Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1,
``γ_n Σ|a_k b_k|`` per n-term sum, ``γ_n = n u / (1 - n u)``, ``u = 2^-53``), so the bounds hold
for the exact (real-number) network and a big-M constant never cuts off a real point. No fixed
slack is added here.

The engine bounds a JAX function; the `Network`'s affine view is `milp.network.affine_chain`,
which returns every pre-activation ``z_m = W_m h_{m-1} + b_m`` (``h_0 = x``, ``h_m = relu(z_m)``)
as an output.
Interval parameters (a hyper-network, Sphynx, §4) are passed as `boundjax.Interval` leaves.

* ``"ibp"``: ``bj.ibp(affine_chain, sound=True, matmul="best")`` (interval bound propagation,
  Gowal et al. 2018; a product of two boxes bounded by the intersection of the midpoint–radius
  and sign-split forms, `boundjax.domains.interval`).
* ``"crown"``: ``bj.crown(affine_chain, sound=True)`` (CROWN, Zhang et al. 2018, §3: every ReLU
  input is bounded by its own backward pass, so the pre-activations returned as outputs cost no
  extra pass), intersected with IBP (both sound). With interval weights (a hyper-network) the
  engine relaxes each product of two boxes by McCormick planes (McCormick 1976, §3).

Sparse layer matrices (convolutions from `milp.network.from_flax`) are densified for the engine.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import boundjax as bj
from boundjax.core.interval import Interval
from milp.network import (AffineLayer, Network, Params, affine_chain, layer_params,  # noqa: F401
                          network_params)

Bounds = list[tuple[np.ndarray, np.ndarray]]


def _quiet(fn: Callable) -> Callable:
  """``fn`` with the engine's CROWN fallback warnings silenced (a product of two boxes, i.e.
  interval weights, is bounded by intervals: expected here and documented above)."""
  @functools.wraps(fn)
  def call(*args):
    with warnings.catch_warnings():
      warnings.filterwarnings("ignore", message="bj.crown: no linear relaxation")
      return fn(*args)
  return call


@functools.lru_cache(maxsize=None)
def _engine(kind: str, fn: Callable) -> Callable:
  """A jitted ``(params, lo, hi) -> [Interval]`` bounding ``fn(params, x)`` over ``x in [lo, hi]``
  with the engine in sound mode (one compilation per parameter structure and shapes)."""
  if kind == "ibp":
    bound = bj.ibp(fn, sound=True, matmul="best")
  else:
    bound = bj.crown(fn, sound=True, batch_axis=None)
  return _quiet(jax.jit(lambda p, lo, hi: bound(p, Interval(lo, hi, validate=False))))


def engine_bounds(fn: Callable, params: Any, lo: np.ndarray, hi: np.ndarray,
                  method: str, with_ibp: bool = True) -> list[tuple[np.ndarray, np.ndarray]]:
  """Sound float64 bounds ``[(lower, upper)]`` of every output of ``fn(params, x)`` over the box
  ``x in [lo, hi]``: ``bj.ibp`` (``"ibp"``), or ``bj.crown`` intersected with ``bj.ibp``
  (``"crown"``), both with ``sound=True``. ``params`` is built by the caller under
  ``jax.enable_x64(True)``; ``fn`` must be a module-level function (it keys the compile cache).
  ``with_ibp=False`` skips the IBP intersection for ``"crown"`` (one compilation instead of two;
  for concrete networks, whose CROWN bounds rarely lose to IBP)."""
  if method not in ("ibp", "crown"):
    raise ValueError(f"bounds: unknown method {method!r}; use 'ibp' or 'crown'.")
  with jax.enable_x64(True):
    lo64, hi64 = jnp.asarray(lo, jnp.float64), jnp.asarray(hi, jnp.float64)
    res = None
    if method == "ibp" or with_ibp:
      outs = _as_list(_engine("ibp", fn)(params, lo64, hi64))
      res = [(np.asarray(o.lower), np.asarray(o.upper)) for o in outs]
    if method == "crown":
      cr = _as_list(_engine("crown", fn)(params, lo64, hi64))
      cr = [(np.asarray(c.lower), np.asarray(c.upper)) for c in cr]
      res = cr if res is None else [(np.maximum(L, cl), np.minimum(U, cu))
                                    for (L, U), (cl, cu) in zip(res, cr)]
  return [(L, np.maximum(U, L)) for L, U in res]


def _as_list(outs: Any) -> list:
  return [outs] if isinstance(outs, Interval) else list(outs)


def check_box(net: Network, lo: np.ndarray, hi: np.ndarray) -> None:
  if lo.shape != (net.input_size,) or hi.shape != (net.input_size,):
    raise ValueError(
        f"bounds: input box has {lo.size}/{hi.size} entries, the network takes {net.input_size}.")
  if np.any(lo > hi) or not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
    raise ValueError("bounds: input box must be finite with lower <= upper.")


def _box(net: Network, lo: Any, hi: Any) -> tuple[np.ndarray, np.ndarray]:
  lo = np.asarray(lo, np.float64).reshape(-1)
  hi = np.asarray(hi, np.float64).reshape(-1)
  check_box(net, lo, hi)
  return lo, hi


def compute(net: Network, lo: Any, hi: Any, method: str = "ibp") -> Bounds:
  """Pre-activation bounds ``[(L_m, U_m)]`` of every layer (the last is the output) over the
  input box, ``method`` ``"ibp"`` or ``"crown"`` (module docstring); sound float64."""
  if method not in ("ibp", "crown"):
    raise ValueError(f"bounds: unknown method {method!r}; use 'ibp' or 'crown'.")
  lo, hi = _box(net, lo, hi)
  with jax.enable_x64(True):
    params = network_params(net)
  return engine_bounds(affine_chain, params, lo, hi, method)


def ibp(net: Network, lo: Any, hi: Any) -> Bounds:
  """`compute` with ``method="ibp"``."""
  return compute(net, lo, hi, "ibp")


def crown(net: Network, lo: Any, hi: Any) -> Bounds:
  """`compute` with ``method="crown"`` (CROWN intersected with IBP)."""
  return compute(net, lo, hi, "crown")


def _spec_chain(params: tuple[Params, jax.Array, jax.Array], x: jax.Array) -> jax.Array:
  """``C y - d`` for ``y`` the output of `affine_chain` (the specification composed into the
  function: in sound mode the engine takes no ``spec=``, and a composed ``C`` is the same
  backward start ``Λ = C``, CROWN, Zhang et al. 2018, §3.3)."""
  chain, C, d = params
  return jnp.dot(C, affine_chain(chain, x)[-1]) - d


def spec_bounds(net: Network, lo: Any, hi: Any, C: Any, d: Any,
                method: str = "crown") -> tuple[np.ndarray, np.ndarray]:
  """Sound float64 bounds on the rows ``C N(x) - d`` over the box (``C`` of shape
  ``(k, n_out)``), with ``C`` composed into the function, so CROWN bounds each row by
  back-substitution instead of combining the intervals of ``y``."""
  lo, hi = _box(net, lo, hi)
  with jax.enable_x64(True):
    params = (network_params(net), jnp.asarray(C, jnp.float64), jnp.asarray(d, jnp.float64))
  (L, U), = engine_bounds(_spec_chain, params, lo, hi, method)
  return L, U


def _chain_and_spec(params: tuple[Params, jax.Array, jax.Array], x: jax.Array) -> list:
  """Every pre-activation of `affine_chain` and, last, the rows ``C y - d`` of its output."""
  chain, C, d = params
  outs = affine_chain(chain, x)
  return outs + [jnp.dot(C, outs[-1]) - d]


def compute_with_spec(net: Network, lo: Any, hi: Any, C: Any, d: Any, method: str = "crown",
                      with_ibp: bool = True) -> tuple[Bounds, tuple[np.ndarray, np.ndarray]]:
  """`compute` and `spec_bounds` in one engine call (one compilation per network and ``C``
  shape): ``(pre-activation bounds of every layer, (lower, upper) of C N(x) - d)``."""
  lo, hi = _box(net, lo, hi)
  with jax.enable_x64(True):
    params = (network_params(net), jnp.asarray(C, jnp.float64), jnp.asarray(d, jnp.float64))
  res = engine_bounds(_chain_and_spec, params, lo, hi, method, with_ibp)
  return res[:-1], res[-1]


def _linear_map(params: tuple[jax.Array, jax.Array], y: jax.Array) -> jax.Array:
  C, d = params
  return jnp.dot(C, y) - d


def interval_rows(C: Any, d: Any, L: Any, U: Any) -> tuple[np.ndarray, np.ndarray]:
  """Sound float64 bounds on ``C y - d`` for ``y`` in the box ``[L, U]`` (``bj.ibp`` in sound
  mode: the interval product rounded outward by its a-priori error)."""
  with jax.enable_x64(True):
    params = (jnp.asarray(C, jnp.float64), jnp.asarray(d, jnp.float64))
  (lo, hi), = engine_bounds(_linear_map, params, np.asarray(L, np.float64),
                            np.asarray(U, np.float64), "ibp")
  return lo, hi


def count_unstable(bounds: Bounds) -> int:
  """Number of hidden neurons whose pre-activation interval straddles 0 (binaries needed)."""
  return int(sum(np.sum((L < 0) & (U > 0)) for L, U in bounds[:-1]))


def stacked_params(ws: Sequence[np.ndarray], bs: Sequence[np.ndarray]) -> Params:
  """Float64 engine leaves of a stack of concrete networks (``ws[m]`` of shape ``(K, out, in)``);
  call under ``jax.enable_x64(True)``."""
  return [(jnp.asarray(w, jnp.float64), jnp.asarray(b, jnp.float64)) for w, b in zip(ws, bs)]


@functools.lru_cache(maxsize=None)
def _stacked_engine(kind: str) -> Callable:
  """``(stacked chain params, C, d, lo, hi) -> (lower, upper)`` of ``C N_k(x) - d`` for every
  member ``k`` of a stack: the engine's bound vmapped over the members, jitted."""
  one = _engine(kind, _spec_chain).__wrapped__
  return _quiet(jax.jit(jax.vmap(lambda p, C, d, lo, hi: one((p, C, d), lo, hi),
                                 in_axes=(0, None, None, None, None))))


def stacked_spec_bounds(ws: Sequence[np.ndarray], bs: Sequence[np.ndarray], C: Any, d: Any,
                        lo: Any, hi: Any, method: str) -> tuple[np.ndarray, np.ndarray]:
  """`spec_bounds` for each member of a stack of concrete networks at once: ``(K, k)`` lower
  and upper bounds of ``C N_k(x) - d`` (``"crown"``: CROWN intersected with IBP)."""
  if method not in ("ibp", "crown"):
    raise ValueError(f"bounds: unknown method {method!r}; use 'ibp' or 'crown'.")
  with jax.enable_x64(True):
    args = (stacked_params(ws, bs), jnp.asarray(C, jnp.float64), jnp.asarray(d, jnp.float64),
            jnp.asarray(lo, jnp.float64), jnp.asarray(hi, jnp.float64))
    out = _stacked_engine("ibp")(*args)
    L, U = np.asarray(out.lower), np.asarray(out.upper)
    if method == "crown":
      cr = _stacked_engine("crown")(*args)
      L, U = np.maximum(L, np.asarray(cr.lower)), np.minimum(U, np.asarray(cr.upper))
  return L, np.maximum(U, L)
