"""The windowed ("patches") backward pass for a local layer behind one ReLU of an affine map of
the box (see the package docstring)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.core import rounding
from boundjax.core.program import Var as _Var

from boundjax.domains.linear import prefix as _backward
from boundjax.domains.linear.rules import (
    CrownProgram, is_float, op_record, relu_lines)


# ----------------------------------------------------------------------------------------------
# Windowed ("patches") backward pass for local layers
# ----------------------------------------------------------------------------------------------

PATTERN_BYTES = 1 << 30
"""The most bytes of the trace-time identity whose transpose gives the non-zero pattern of
``A`` (``n_s² ·`` itemsize); beyond, the target keeps the dense pass."""


@dataclasses.dataclass
class _PatchPlan:
  """A backward pass ``target <- L2 <- relu(s) <- A <- x`` (x a box input) done on windows.

  Rows of ``Λ`` that share their support in ``s`` (for a convolution: the target neurons at one
  spatial position) form a group ``g`` with support ``S_g`` (k entries of s) and input window
  ``X_g`` (q entries of x, the union of the supports of ``A``'s rows in ``S_g``).
  """
  s: _Var  # the ReLU input
  x: _Var  # the box input
  rows: Any  # (G, r) int: target rows of each group (pad: m)
  pos: Any  # (m,) int: where row i sits in the flattened (G, r)
  S: Any  # (G, k) int: support of the group in s (pad: n_s)
  X: Any  # (G, q) int: input window of the group (pad: n_x)
  mu: Any  # (G, r, k): the coefficients of s-side ReLU outputs (from the prefix)
  M: Any  # (G, k, q): A restricted to S_g x X_g
  bias_t: Any  # (m,) offset of the target above the ReLU
  bias_s: Any  # (n_s + 1,) offset of s (A x + bias_s), padded with 0
  prefix_t: Any = None  # sound mode: the target's prefix (its rounding slack, per row)
  prefix_s: Any = None  # sound mode: the prefix of s (the slack of A and bias_s, per entry of s)


def _ones_cenv(prog: CrownProgram, anc: list[int]):
  """Concrete operands of ``anc`` with every float value replaced by ones, or None when a
  concrete operand is not a float (its value would matter for the pattern)."""
  env = {}
  for i in anc:
    e = prog.eqns[i]
    if e.kind == "relu":
      continue
    if e.kind != "affine" or not op_record(e.name).pattern_safe:
      return None
    for j, a in enumerate(e.invars):
      if j in e.abstract_pos or not isinstance(a, _Var):
        continue
      if not is_float(a.aval):
        return None
      env[a] = np.ones(a.shape, a.aval.dtype)
  return env


def _support(prog: CrownProgram, target: _Var, anc: list[int], var_of) -> np.ndarray | None:
  """Boolean ``(m, n)`` superset of the non-zero pattern of ``Λ`` rows at one variable, from
  the transpose with all-ones coefficients (evaluated once, at trace time)."""
  env = _ones_cenv(prog, anc)
  if env is None:
    return None
  with jax.ensure_compile_time_eval():
    px = _backward.build_prefix(prog, env, target, anc, False)
    lam = var_of(px)
    if lam is None:
      return None
    return np.asarray(lam).reshape((px.m, -1)) != 0


def patch_plan(prog: CrownProgram, cenv: dict, target: _Var, prefixes: dict,
                ancestors: dict, sound: bool = False) -> _PatchPlan | None:
  """The windowed plan for ``target``, or None when the pattern does not apply or does not pay
  (or, in sound mode, when the target is not float32/float64: γ_n of a low format is too coarse
  for the window sums)."""
  px: _backward.Prefix = prefixes[target]
  if len(px.pending) != 1 or px.at_input:
    return None
  if sound and np.dtype(target.aval.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
    return None
  (z, mu), = px.pending.items()
  relu = [prog.eqns[i] for i in ancestors[target]
          if prog.eqns[i].kind == "relu" and prog.eqns[i].outvars[0] is z]
  if len(relu) != 1:
    return None
  e = relu[0]
  if e.name != "max" or not _backward.is_zero(e.invars[1 - e.abstract_pos[0]]):
    return None
  s = e.invars[e.abstract_pos[0]]
  ps: _backward.Prefix | None = prefixes.get(s)
  if ps is None or ps.pending or len(ps.at_input) != 1:
    return None
  (x, a_mat), = ps.at_input.items()
  m, n_s, n_x = target.size, s.size, x.size
  above = [i for i in ancestors[target] if i not in set(ancestors[s])]
  pat_mu = _support(prog, target, above, lambda p: p.pending.get(z))
  if pat_mu is None:
    return None
  k = int(pat_mu.sum(1).max())
  # windows pay only on a part of s (a dense layer's target sees all of it), and the
  # pattern of A is found from n_s rows of n_s entries at trace time: at most `PATTERN_BYTES`
  if k == 0 or 2 * k > n_s or n_s * n_s * np.dtype(s.aval.dtype).itemsize > PATTERN_BYTES:
    return None
  pat_a = _support(prog, s, ancestors[s], lambda p: p.at_input.get(x))
  if pat_a is None:
    return None
  # groups of rows with the same support in s (sorted, padded with n_s)
  S_rows = np.full((m, k), n_s, np.int64)
  for i in range(m):
    nz = np.flatnonzero(pat_mu[i])
    S_rows[i, :nz.size] = nz
  S, group = np.unique(S_rows, axis=0, return_inverse=True)
  group = group.reshape(-1)
  G = S.shape[0]
  counts = np.bincount(group, minlength=G)
  r = int(counts.max())
  rows = np.full((G, r), m, np.int64)
  pos = np.zeros((m,), np.int64)
  fill = np.zeros((G,), np.int64)
  for i in range(m):
    g = group[i]
    rows[g, fill[g]] = i
    pos[i] = g * r + fill[g]
    fill[g] += 1
  pat_a_pad = np.concatenate([pat_a, np.zeros((1, n_x), bool)])
  windows = [np.flatnonzero(pat_a_pad[S[g]].any(0)) for g in range(G)]
  q = max(1, max(w.size for w in windows))
  X = np.full((G, q), n_x, np.int64)
  for g, w in enumerate(windows):
    X[g, :w.size] = w
  # pays only when the windows are a small part of the dense map
  if k * q * 8 > n_s * n_x or G * (k * q + r * k) > (1 << 26):
    return None
  dtype = target.aval.dtype
  mu_pad = jnp.pad(mu.reshape((m, n_s)), ((0, 1), (0, 1)))
  a_pad = jnp.pad(a_mat.reshape((n_s, n_x)), ((0, 1), (0, 1)))
  return _PatchPlan(
      s=s, x=x, rows=rows, pos=pos, S=S, X=X,
      mu=mu_pad[rows[:, :, None], S[:, None, :]],
      M=a_pad[S[:, :, None], X[:, None, :]],
      bias_t=px.bias, bias_s=jnp.concatenate([ps.bias, jnp.zeros((1,), dtype)]),
      prefix_t=px if sound else None, prefix_s=ps if sound else None)


def windows_bytes(plan: _PatchPlan) -> int:
  """Per-example bytes of `backward_patches`' largest arrays: ``ν`` (G, 2r, k), ``Λ_x``
  (G, 2r, q) and their absolute values, next to the plan's own ``M`` (G, k, q)."""
  G, r, k = plan.mu.shape
  q = plan.M.shape[2]
  return int(G * (4 * r * (k + q) + k * q) * np.dtype(plan.bias_t.dtype).itemsize)


def backward_patches(plan: _PatchPlan, target: _Var, ivs: dict, pre: dict,
                     cenv: dict | None = None, prog: CrownProgram | None = None):
  """`_backward` for a target with a `_PatchPlan`: the same bounds, up to the order of float
  sums, computed on each group's window only.

  With ``μ`` the coefficients of ``relu(s)`` and the ReLU lines ``(a_lo, a_up, b_up)`` on
  ``[l, u]`` of ``s``: ``ν_lo = μ·(μ>0 ? a_lo : a_up)``, ``ν_hi = μ·(μ>0 ? a_up : a_lo)``,
  ``Λ_x = ν M``, and ``lower = bias_t + min(μ,0)·b_up + ν_lo·bias_s + Λ_x·c - |Λ_x|·r`` on the
  window (upper: max, ``+|Λ_x|·r``).

  Sound mode (a plan built with ``sound=True``; ``cenv`` and ``prog`` given): the ReLU lines are
  valid in real arithmetic (`relu_lines`), and the bounds widen by twice the a-priori rounding
  error of every float quantity (`_window_slack`), then one ulp outward, as the dense pass does.
  """
  sound = plan.prefix_t is not None
  l, u = pre[plan.s]
  l, u = l.reshape(-1), u.reshape(-1)
  if sound:
    l, u = rounding.round_down(l), rounding.round_up(u)
  a_lo, a_up, b_up = relu_lines(l, u, sound)
  a_lo, a_up, b_up = _pad(a_lo)[plan.S], _pad(a_up)[plan.S], _pad(b_up)[plan.S]  # (G, k)
  mu = plan.mu  # (G, r, k)
  pos = mu > 0
  nu_lo = mu * jnp.where(pos, a_lo[:, None], a_up[:, None])
  nu_hi = mu * jnp.where(pos, a_up[:, None], a_lo[:, None])
  nu = jnp.concatenate([nu_lo, nu_hi], axis=1)  # (G, 2r, k)
  bs = plan.bias_s[plan.S]  # (G, k)
  off = jnp.einsum("grk,gk->gr", nu, bs)
  r_ = mu.shape[1]
  mu_b = jnp.concatenate([jnp.einsum("grk,gk->gr", jnp.minimum(mu, 0), b_up),
                          jnp.einsum("grk,gk->gr", jnp.maximum(mu, 0), b_up)], axis=1)
  off = off + mu_b
  lam_x = jnp.einsum("grk,gkq->grq", nu, plan.M)  # (G, 2r, q)
  c, rad = _backward.center_radius(ivs[plan.x], sound)
  c, rad = _pad(c.reshape(-1))[plan.X], _pad(rad.reshape(-1))[plan.X]  # (G, q)
  lin = jnp.einsum("grq,gq->gr", lam_x, c)
  spread = jnp.einsum("grq,gq->gr", jnp.abs(lam_x), rad)
  lower = (off[:, :r_] + lin[:, :r_] - spread[:, :r_]).reshape(-1)[plan.pos]
  upper = (off[:, r_:] + lin[:, r_:] + spread[:, r_:]).reshape(-1)[plan.pos]
  lower, upper = lower + plan.bias_t, upper + plan.bias_t
  if sound:
    slack = _window_slack(plan, cenv, prog, ivs, nu, b_up, bs, lam_x, c, rad)
    lower, upper = rounding.outward(lower - 2 * slack[0], upper + 2 * slack[1], ulps=1)
  return lower.reshape(target.shape), upper.reshape(target.shape)


def _pad(v):
  """``v`` with one 0 appended: the value read at a window's padding index."""
  return jnp.concatenate([v, jnp.zeros((1,), v.dtype)])


def _window_slack(plan: _PatchPlan, cenv: dict, prog: CrownProgram, ivs: dict, nu, b_up, bs,
                  lam_x, c, rad):
  """(2, m) a-priori rounding error of `backward_patches` (lower rows, upper rows), each term a
  γ_n bound of an n-term float sum (Higham, *Accuracy and Stability of Numerical Algorithms*,
  §3.1) with the flushing term of `rounding.flush_error`, as the dense pass charges them:

  * the prefixes: ``μ`` and ``bias_t`` (the target's, per row) and ``M``, ``bias_s`` (the prefix
    of ``s``, per entry ``e_s`` of ``s``, which reaches the bound as ``|ν|·e_s``);
  * the ReLU step: ``ν = μ·a`` against the real product, weighted by ``|s|``, and ``μ·b_up``;
  * ``Λ_x = ν M`` (k terms per entry) weighted by ``|x|``;
  * the final sums ``bias_t + ν·bias_s + μ·b_up + Λ_x·c ± |Λ_x|·r`` (2k + 2q + 1 terms).
  """
  dtype = plan.bias_t.dtype
  G, r2, k = nu.shape
  q = lam_x.shape[2]
  r_ = r2 // 2
  mag_s, mag_x = _backward.magnitude(ivs[plan.s]), _backward.magnitude(ivs[plan.x])
  anu, amu = jnp.abs(nu), jnp.abs(plan.mu)
  # the prefix of s: |ν|·e_s
  e_s = _pad(_backward.prefix_slack(plan.prefix_s, cenv, ivs, dtype))[plan.S]  # (G, k)
  slack = jnp.einsum("grk,gk->gr", anu, e_s)
  # the ReLU step: ν against μ·a (weighted by |s|), and μ·b_up
  n_relu = 2 + prog.uses.get(plan.s, 1)
  slack = slack + _backward.coefficient_slack(
      n_relu, dtype, jnp.einsum("grk,gk->gr", anu, _pad(mag_s.reshape(-1))[plan.S]), ivs[plan.s])
  # Λ_x = ν M: k-term sums, weighted by |x|
  a_m = jnp.einsum("gkq,gq->gk", jnp.abs(plan.M), _pad(mag_x.reshape(-1))[plan.X])
  slack = slack + _backward.coefficient_slack(k + 2, dtype, jnp.einsum("grk,gk->gr", anu, a_m),
                                              ivs[plan.x])
  # the final sums
  amu_b = jnp.einsum("grk,gk->gr", amu, b_up)
  absum = (jnp.einsum("grk,gk->gr", anu, jnp.abs(bs)) + jnp.concatenate([amu_b, amu_b], axis=1)
           + jnp.einsum("grq,gq->gr", jnp.abs(lam_x), jnp.abs(c) + rad))
  n = 2 * k + 2 * q + 8
  slack = slack + rounding.gamma(n, dtype) * absum + rounding.flush_error(n, dtype)
  lower = slack[:, :r_].reshape(-1)[plan.pos]
  upper = slack[:, r_:].reshape(-1)[plan.pos]
  # the target's prefix (μ, bias_t) and the final addition of bias_t
  own = _backward.prefix_slack(plan.prefix_t, cenv, ivs, dtype) \
      + rounding.gamma(n, dtype) * jnp.abs(plan.bias_t)
  return jnp.stack([lower + own, upper + own])
