"""Layered CROWN with split constraints for feed-forward ReLU networks, batched and jitted, float64.

Status: input splitting (`boundjax.verify.input_bab`, ACAS Xu) still bounds with this module;
ReLU splitting (`relu_bab`) runs on the engine (`boundjax.verify.chain`). The engine's
equivalent of `crown_batch` (`chain.crown_batch`, same arguments and returns) is as tight
(tests/test_crown_splits.py) but, measured on an ACAS Xu-shaped 6x50 chain in sound mode on the
loaded 2-core machine, compiles in 78-160 s instead of 17-20 s and runs 1024 boxes in 3.5 s
instead of 1.75 s: more than ACAS Xu's 60 s limit per instance. The forward linear bounds
(``intermediate="forward"``/``"both"``) have no engine counterpart yet.

The network is ``z_1 = W_0 x + b_0``, ``h_i = ReLU(z_i)``, ``z_{i+1} = W_i h_i + b_i``, output
``y = z_L`` (a `milp.network.Network` with point parameters). A *sub-problem* is an input box
``[lo, hi]`` plus a split mask per hidden layer (``+1``: the neuron is constrained active,
``z >= 0``; ``-1``: inactive, ``z <= 0``; ``0``: free).

Bounds (CROWN, Zhang et al. 2018, §3): for a linear objective ``a^T z_k`` the backward pass
carries coefficients ``Λ`` from layer ``k`` to the input. Through ``z_{i+1} = W_i h_i + b_i`` it
sets ``Λ <- Λ W_i`` and adds ``Λ b_i`` to the constant. Through ``h_i = ReLU(z_i)`` with
pre-activation bounds ``[l, u]`` it uses the linear relaxation

    α z <= ReLU(z) <= s (z - l),   s = u / (u - l)          (unstable: l < 0 < u, α in [0, 1])

exact (``h = z`` or ``h = 0``) for stable neurons: positive coefficients take the lower line,
negative ones the upper line. At the input, ``min_{x in box} Λ x = Λ^+ lo + Λ^- hi``.

* Intermediate bounds: ``z_1`` by one such pass (exact for a box), then for each ``k >= 2`` a
  pass from the objective ``[I; -I] z_k`` with the adaptive lower slope ``α = 1[u > -l]``
  (CROWN's choice). Splits clip the bounds: ``+1`` sets ``l <- max(l, 0)``, ``-1`` sets
  ``u <- min(u, 0)`` (the sub-domains of a split cover the parent's).
* Output bounds of ``C y - d`` directly (bounding a linear function of the outputs is tighter
  than combining the outputs' bounds, CROWN §3.3), with per-row slopes ``α`` (α-CROWN, Xu et al.
  2021, §3.1) and Lagrange multipliers ``β >= 0`` of the split constraints: for a split neuron
  with sign ``s``, ``min_{s z >= 0} g >= min g - β s z`` (β-CROWN, Wang et al. 2021, §3.1),
  i.e. ``-β s`` is added to the coefficient of ``z``. `optimise` runs a few Adam steps of
  projected gradient ascent on α and β (any α in [0, 1], β >= 0 gives a valid bound, so the
  best bound seen is kept).

Soundness of floating point (``sound=True``): the bound must hold in exact real arithmetic on
the network's (float64) weights. Every step's rounding is bounded a priori (Higham §3.1,
`boundjax.core.rounding.sum_error`): a product ``Λ W`` computed in floats differs from the exact one
by at most ``γ_{2n+2} |Λ| |W|`` entrywise, and the error it causes is at most
``γ_{2n+2} |Λ| (|W| h_max)`` with ``h_max`` the largest ``|h|`` the bounds allow — computed as two
matrix-vector products, never a second matrix product. ReLU steps pay ``γ`` times ``|Λ|(slopes
|z|_max + |q|)``; the upper line's intercept is raised by ``4u(|s l| + |u|)`` so that the float
line lies above ReLU at both ends (hence on ``[l, u]``, ReLU being convex); the constants' sums
pay a final ``γ_{4L+8}`` of their magnitude, and the result is rounded down one ulp. The cost is
a few matrix-vector products per layer (measured: see `boundjax.verify` docs).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from boundjax.core import rounding

F64 = np.float64
_U = float(np.finfo(np.float64).eps) / 2
_TINY = float(np.finfo(np.float64).tiny)


from boundjax.verify.chain import Layers, forward, forward_np, from_network  # noqa: E402,F401


def _gamma(n: int) -> float:
  return rounding.gamma(2 * int(n) + 2, np.float64)


def relax(l: jnp.ndarray, u: jnp.ndarray, sound: bool):
  """ReLU relaxation on ``[l, u]``: upper line ``s z + q`` and masks (active, unstable)."""
  active = l >= 0
  unstable = (l < 0) & (u > 0)
  du = jnp.where(unstable, u - l, 1.0)
  s = jnp.where(unstable, u / du, jnp.where(active, 1.0, 0.0))
  q = jnp.where(unstable, -s * l, 0.0)
  if sound:  # float line above ReLU at z = l and z = u (hence on [l, u]): see module docstring
    q = q + jnp.where(unstable, 4 * _U * (jnp.abs(s * l) + jnp.abs(u)) + 4 * _TINY, 0.0)
  return s, q, active, unstable


def backward(lay: Layers, a: jnp.ndarray, k: int, lo, hi, lbs: Sequence, ubs: Sequence,
             alphas: Sequence | None = None, betas: Sequence | None = None,
             splits: Sequence | None = None, sound: bool = False, const=None):
  """Lower bounds of ``a z_k + const`` (``a``: (R, n_k)) over one sub-problem (unbatched).

  ``lbs[i-1], ubs[i-1]``: bounds of ``z_i`` for ``i < k``; ``alphas[i-1]``, ``betas[i-1]``:
  (R, n_i) or None (adaptive α, no β). Returns ``(bound (R,), lam0 (R, n_0), lams)`` where
  ``lams[i-1]`` (R, n_i) are the coefficients on ``h_i`` (for branching scores).
  """
  R = a.shape[0]
  const = jnp.zeros((R,), a.dtype) if const is None else const
  err = jnp.zeros((R,), a.dtype)
  mag = jnp.abs(const)
  xmax = jnp.maximum(jnp.abs(lo), jnp.abs(hi))
  lams = [None] * (k - 1)
  for i in range(k, 0, -1):  # a: coefficients on z_i; step back through W_{i-1}
    w, b = lay.Ws[i - 1], lay.bs[i - 1]
    lam = a @ w
    const = const + a @ b
    if sound:
      hmax = xmax if i == 1 else jnp.maximum(ubs[i - 2], 0.0)
      m = jnp.abs(a) @ (lay.absWs[i - 1] @ hmax + jnp.abs(b))
      err = err + _gamma(w.shape[1]) * m * (1 + 4 * _U) + 2 * w.shape[1] * _TINY
      mag = mag + m
    if i == 1:
      break
    j = i - 1  # hidden layer j: h_j = ReLU(z_j)
    lams[j - 1] = lam
    l, u = lbs[j - 1], ubs[j - 1]
    s, q, active, unstable = relax(l, u, sound)
    if alphas is None:
      alpha = (u > -l).astype(a.dtype)
    else:
      alpha = alphas[j - 1]
    low = jnp.where(active, 1.0, jnp.where(unstable, alpha, 0.0))
    pos, neg = jnp.maximum(lam, 0.0), jnp.minimum(lam, 0.0)
    a = pos * low + neg * s
    const = const + neg @ q
    beta_mag = 0.0
    if betas is not None:
      a = a - betas[j - 1] * splits[j - 1].astype(a.dtype)
      beta_mag = jnp.abs(betas[j - 1]) * jnp.abs(splits[j - 1]).astype(a.dtype)
    if sound:
      zmax = jnp.maximum(jnp.abs(l), jnp.abs(u))
      m = (jnp.abs(lam) * (low + s) + beta_mag) @ zmax + jnp.abs(neg) @ jnp.abs(q)
      err = err + _gamma(l.shape[0]) * m * (1 + 4 * _U) + 4 * l.shape[0] * _TINY
      mag = mag + m
  inp = jnp.maximum(lam, 0.0) @ lo + jnp.minimum(lam, 0.0) @ hi
  bound = const + inp
  if sound:
    m = jnp.abs(lam) @ xmax
    err = err + _gamma(lo.shape[0]) * m * (1 + 4 * _U) + 2 * lo.shape[0] * _TINY
    mag = mag + m
    steps = 4 * k + 8
    slack = err + rounding.gamma(steps, np.float64) * (mag + err) * (1 + 4 * _U) + steps * _TINY
    bound = bound - slack
    # two ulps down; x + (rd(x) - x) == rd(x) exactly (Sterbenz), and keeps gradients for α/β
    frozen = jax.lax.stop_gradient(bound)
    bound = bound + (rounding.round_down(rounding.round_down(frozen)) - frozen)
  return bound, lam, lams


def _clip(l, u, split):
  if split is None:
    return l, u
  return jnp.where(split > 0, jnp.maximum(l, 0.0), l), jnp.where(split < 0, jnp.minimum(u, 0.0), u)


def _meet(l, u, prior, k):
  """Intersects layer ``k``'s bounds with ``prior = (lbs, ubs)`` (bounds valid on a superset of
  the sub-problem, e.g. the parent box's: both hold, so their intersection does)."""
  if prior is None:
    return l, u
  return jnp.maximum(l, prior[0][k - 1]), jnp.minimum(u, prior[1][k - 1])


def intermediate_one(lay: Layers, lo, hi, splits=None, sound: bool = False, prior=None):
  """Pre-activation bounds ``(lbs, ubs)`` of every hidden layer for one sub-problem, clipped by
  the splits (and intersected with ``prior``, see `_meet`), and ``infeasible`` (some ``l > u``:
  the sub-problem is empty)."""
  lbs, ubs = [], []
  infeasible = jnp.zeros((), bool)
  for k, n in enumerate(lay.hidden, start=1):
    eye = jnp.eye(n, dtype=lo.dtype)
    bnd, _, _ = backward(lay, jnp.concatenate([eye, -eye]), k, lo, hi, lbs, ubs, sound=sound)
    l, u = _meet(bnd[:n], -bnd[n:], prior, k)
    l, u = _clip(l, u, None if splits is None else splits[k - 1])
    infeasible = infeasible | jnp.any(l > u)
    u = jnp.maximum(u, l)  # keep the relaxation well defined; the sub-problem is dropped anyway
    lbs.append(l)
    ubs.append(u)
  return tuple(lbs), tuple(ubs), infeasible


def intermediate_forward_one(lay: Layers, lo, hi, splits=None, sound: bool = False, prior=None):
  """Pre-activation bounds by forward linear bounds (symbolic intervals with CROWN's
  relaxations; cheaper than `intermediate_one` when the input is small, looser on big boxes).

  Each ``z_k`` is kept between two affine functions of the input, ``A_l x + c_l <= z_k <=
  A_u x + c_u``. Through ReLU: ``h >= low * z >= low * (A_l x + c_l)`` (``low >= 0``) and
  ``h <= s z + q <= s (A_u x + c_u) + q``; through ``W``: lower ``W^+ (lower) + W^- (upper)``.
  Bounds of ``z_k`` are these functions' extremes over the box. Sound mode subtracts from each
  constant ``γ`` times the largest magnitude the summed terms reach on the box (Higham §3.1).
  """
  xmax = jnp.maximum(jnp.abs(lo), jnp.abs(hi))
  n0 = lo.shape[0]

  def extremes(A, c):
    lo_v = jnp.maximum(A, 0.0) @ lo + jnp.minimum(A, 0.0) @ hi + c
    hi_v = jnp.maximum(A, 0.0) @ hi + jnp.minimum(A, 0.0) @ lo + c
    if sound:
      e = _gamma(n0) * (jnp.abs(A) @ xmax + jnp.abs(c)) * (1 + 4 * _U) + 4 * n0 * _TINY
      lo_v, hi_v = rounding.round_down(lo_v - e), rounding.round_up(hi_v + e)
    return lo_v, hi_v

  def mags(A, c):
    return jnp.abs(A) @ xmax + jnp.abs(c)

  w, b = lay.Ws[0], lay.bs[0]
  Al, cl, Au, cu = w, b, w, b
  lbs, ubs = [], []
  infeasible = jnp.zeros((), bool)
  for k, n in enumerate(lay.hidden, start=1):
    l, _ = extremes(Al, cl)
    _, u = extremes(Au, cu)
    l, u = _meet(l, u, prior, k)
    l, u = _clip(l, u, None if splits is None else splits[k - 1])
    infeasible = infeasible | jnp.any(l > u)
    u = jnp.maximum(u, l)
    lbs.append(l)
    ubs.append(u)
    if k == len(lay.hidden):
      break
    s, q, active, unstable = relax(l, u, sound)
    low = jnp.where(active, 1.0, jnp.where(unstable, (u > -l).astype(l.dtype), 0.0))
    hAl, hcl = low[:, None] * Al, low * cl
    hAu, hcu = s[:, None] * Au, s * cu + q
    e_relu = 0.0
    if sound:
      e_relu = 4 * _U * (low * mags(Al, cl) + s * mags(Au, cu) + jnp.abs(q)) + 4 * _TINY
    w, b = lay.Ws[k], lay.bs[k]
    wp, wn = jnp.maximum(w, 0.0), jnp.minimum(w, 0.0)
    Al, cl, Au, cu = (wp @ hAl + wn @ hAu, wp @ hcl + wn @ hcu + b,
                      wp @ hAu + wn @ hAl, wp @ hcu + wn @ hcl + b)
    if sound:
      m = lay.absWs[k] @ (mags(hAl, hcl) + mags(hAu, hcu) + 2 * e_relu) + jnp.abs(b)
      e = _gamma(w.shape[1] + 1) * m * (1 + 4 * _U) + 4 * w.shape[1] * _TINY
      e = e + lay.absWs[k] @ e_relu * (1 + 4 * _U)
      cl, cu = cl - e, cu + e
  return tuple(lbs), tuple(ubs), infeasible


def output_one(lay: Layers, C, d, lo, hi, lbs, ubs, splits=None, alphas=None, betas=None,
               sound: bool = False):
  """Lower bounds of ``C y - d`` (R,) for one sub-problem; also ``lam0`` and ``lams``."""
  L = len(lay.Ws)
  return backward(lay, C, L, lo, hi, lbs, ubs, alphas, betas, splits, sound, const=-d)


@functools.partial(jax.jit, static_argnames=("sound",))
def intermediate_batch(lay: Layers, lo, hi, splits, sound: bool):
  """`intermediate_one` vmapped over sub-problems: ``lo, hi`` (B, n_0), ``splits`` per layer."""
  return jax.vmap(lambda l, h, s: intermediate_one(lay, l, h, s, sound))(lo, hi, splits)


def crown_batch(lay: Layers, C, d, lo, hi, splits, sound: bool, intermediate: str = "crown",
                prior=None, prior_mode: str = "layer"):
  """Intermediate and output bounds (adaptive α, no β) for a batch of boxes with splits.

  ``prior``: None or ``(lbs, ubs)`` per layer (B, n_i), bounds known to hold on each box (its
  parent's). ``prior_mode="layer"``: they are intersected with the computed ones layer by
  layer (each layer's pass sees the tighter bounds below it). ``"post"``: the box's own bounds
  are computed without them; the output rows are bounded twice, on the own bounds and on their
  intersection with ``prior``, and the larger bound is kept; ``lam0`` is the first pass's, so
  branching is what it would be without a prior while every bound is at least as tight (the
  tree is a sub-tree of the prior-less one; the "layer" mode's coefficients made ACAS Xu
  2_2 prop_1 need > 30k boxes instead of 1163). ``intermediate``: ``"crown"``,
  ``"forward"`` or ``"both"`` (the intersection of the two).
  Returns ``(bound (B, R), lam0 (B, R, n_0), infeasible (B,), lbs, ubs)`` (``lbs, ubs``: the
  tightest bounds known, to pass on as children's prior); infeasible sub-problems get bound
  ``+inf``.

  The "post" mode is two jitted calls (own bounds, then the second output pass): traced as one
  program, XLA's CPU backend fused it into code 5x slower on ACAS Xu (2.6 s instead of 0.55 s
  per 1024 boxes, measured with jax 0.10)."""
  if prior_mode not in ("layer", "post"):
    raise ValueError(f"crown_batch: prior_mode must be 'layer' or 'post', got {prior_mode!r}.")
  if prior is None or prior_mode == "layer":
    return _crown_batch(lay, C, d, lo, hi, splits, sound, intermediate, prior)
  bnd, lam0, inf, lbs, ubs = _crown_batch(lay, C, d, lo, hi, splits, sound, intermediate, None)
  bnd_met, inf_met, mlbs, mubs = _output_met_batch(lay, C, d, lo, hi, lbs, ubs, prior, sound)
  return jnp.maximum(bnd, bnd_met), lam0, inf | inf_met, mlbs, mubs


@functools.partial(jax.jit, static_argnames=("sound", "intermediate"))
def _crown_batch(lay: Layers, C, d, lo, hi, splits, sound: bool, intermediate: str, prior):
  """`crown_batch` without a prior or with the "layer" mode."""

  def one(l, h, s, pr):
    if intermediate == "both":
      lf, uf, inf1 = intermediate_forward_one(lay, l, h, s, sound, pr)
      lbs, ubs, inf = intermediate_one(lay, l, h, s, sound, (lf, uf))
      inf = inf | inf1
    else:
      inter = intermediate_one if intermediate == "crown" else intermediate_forward_one
      lbs, ubs, inf = inter(lay, l, h, s, sound, pr)
    bnd, lam0 = output_one(lay, C, d, l, h, lbs, ubs, sound=sound)[:2]
    return jnp.where(inf, jnp.inf, bnd), lam0, inf, lbs, ubs
  if prior is None:
    return jax.vmap(lambda l, h, s: one(l, h, s, None))(lo, hi, splits)
  return jax.vmap(one)(lo, hi, splits, prior)


@functools.partial(jax.jit, static_argnames=("sound",))
def _output_met_batch(lay: Layers, C, d, lo, hi, lbs, ubs, prior, sound: bool):
  """The "post" mode's second pass: output bounds on ``(lbs, ubs)`` met with ``prior``.
  Returns ``(bound (B, R), infeasible (B,), met lbs, met ubs)``."""

  def one(l, h, lb, ub, pr):
    met = [_meet(a, b, pr, k) for k, (a, b) in enumerate(zip(lb, ub), start=1)]
    inf = jnp.any(jnp.stack([jnp.any(a > b) for a, b in met]))
    mlbs = tuple(a for a, _ in met)
    mubs = tuple(jnp.maximum(b, a) for a, b in met)
    bnd, _ = output_one(lay, C, d, l, h, mlbs, mubs, sound=sound)[:2]
    return jnp.where(inf, jnp.inf, bnd), inf, mlbs, mubs
  return jax.vmap(one)(lo, hi, lbs, ubs, prior)


@functools.partial(jax.jit, static_argnames=("intermediate",))
def estimate_batch(lay: Layers, C, d, lo, hi, prior, intermediate: str = "crown"):
  """Estimates of the output bounds of ``C y - d`` (B, R) on boxes whose pre-activations are
  known to lie in ``prior`` (a parent box's bounds): intermediate bounds met with ``prior``
  layer by layer (CROWN, `intermediate_one`, or forward, `intermediate_forward_one`), then one
  CROWN output pass, without the rounding allowance (``sound=False``): only for ranking
  branching choices, never for a verdict."""
  inter = intermediate_forward_one if intermediate == "forward" else intermediate_one

  def one(l, h, pr):
    lbs, ubs, inf = inter(lay, l, h, None, False, pr)
    bnd, _ = output_one(lay, C, d, l, h, lbs, ubs, sound=False)[:2]
    return jnp.where(inf, jnp.inf, bnd)
  return jax.vmap(one)(lo, hi, prior)


def default_alphas(lbs, ubs, R: int):
  """CROWN's adaptive slopes broadcast to (B, R, n_i) per layer, the start of α-CROWN."""
  return tuple(jnp.broadcast_to((u > -l).astype(l.dtype)[:, None, :], (l.shape[0], R, l.shape[1]))
               for l, u in zip(lbs, ubs))


@functools.partial(jax.jit, static_argnames=("steps", "sound", "use_beta"))
def optimise(lay: Layers, C, d, lo, hi, lbs, ubs, splits, alphas, betas, steps: int, lr,
             sound: bool, use_beta: bool = True):
  """α(β)-CROWN: ``steps`` Adam steps of projected gradient ascent on the output bounds.

  Batched: ``lo, hi`` (B, n_0), ``lbs, ubs, splits`` per layer (B, n_i), ``alphas, betas``
  per layer (B, R, n_i). Returns ``(best bound (B, R), alphas, betas, lam0, lams)`` with
  ``lam0, lams`` of the last step (for branching)."""

  def bound(params):
    al, be = params
    f = lambda l, h, lb, ub, s, a_, b_: output_one(
        lay, C, d, l, h, lb, ub, s, a_, b_ if use_beta else None, sound)
    return jax.vmap(f)(lo, hi, lbs, ubs, splits, al, be)

  def loss(params):
    b, lam0, lams = bound(params)
    return -jnp.sum(jnp.where(jnp.isfinite(b), b, 0.0)), (b, lam0, lams)

  opt = optax.adam(lr)
  params = (alphas, betas)
  state = opt.init(params)
  best, lam0, lams = bound(params)

  def step(carry, _):
    params, state, best = carry
    (_, (b, _, _)), g = jax.value_and_grad(loss, has_aux=True)(params)
    best = jnp.maximum(best, b)
    upd, state = opt.update(g, state, params)
    al, be = optax.apply_updates(params, upd)
    al = tuple(jnp.clip(x, 0.0, 1.0) for x in al)
    be = tuple(jnp.maximum(x, 0.0) for x in be)
    return ((al, be), state, best), None

  (params, state, best), _ = jax.lax.scan(step, (params, state, best), None, length=steps)
  b, lam0, lams = bound(params)
  best = jnp.maximum(best, b)
  return best, params[0], params[1], lam0, lams


@functools.partial(jax.jit, static_argnames=("sound", "steps"))
def crown_alpha_batch(lay: Layers, C, d, lo, hi, splits, sound: bool, steps: int, lr=0.1):
  """`crown_batch` (CROWN intermediate bounds) followed by ``steps`` α-CROWN steps on the output
  rows (β = 0); same returns. ``steps=0`` is `crown_batch`."""
  lbs, ubs, inf = jax.vmap(lambda l, h, s: intermediate_one(lay, l, h, s, sound))(lo, hi, splits)
  al = default_alphas(lbs, ubs, C.shape[0])
  be = tuple(jnp.zeros_like(a) for a in al)
  best, _, _, lam0, _ = optimise(lay, C, d, lo, hi, lbs, ubs, splits, al, be, steps, lr, sound,
                                 use_beta=False)
  return jnp.where(inf[:, None], jnp.inf, best), lam0, inf, lbs, ubs
