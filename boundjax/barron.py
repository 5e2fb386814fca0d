"""Barron constants of functions and networks (Diaz, Kairouz, Liao, Sankar, "Theoretical guarantees
for model auditing with finite adversaries", §2 and §5.2).

Convention (paper eq. 7, unitary Fourier transform of eq. 4)::

    C_h = (2 pi)^(-q/2) * integral_{R^q} ||omega||_2 |h_hat(omega)| d omega,
    h_hat(omega) = (2 pi)^(-q/2) * integral h(x) exp(-i omega . x) dx.

When ``h`` itself is not integrable (tanh, logistic, erf) the gradient form is used instead (the
paper's eq. 45 for ``q = 1``): ``C_h = (2 pi)^(-q/2) * integral ||F(grad h)(omega)||_2 d omega``,
which is the same number whenever both exist since ``|F(d_j h)| = |omega_j| |h_hat|``.

Four ways to get a constant:

* `closed_form` — closed forms derived here and checked numerically (the paper computes only
  ``tanh(mu t)``, §5.2): ridge profiles (tanh, tanh(t/2), logistic, erf,
  sech, Gaussian bump), isotropic and general Gaussians, ridge functions ``g(w.x + b)``.
* `fft_1d`, `fft_2d` — FFT quadrature of the gradient form on a uniform grid, in
  float64 by default, jitted, batched over a leading parameter axis with ``params=``. A gradient
  that does not decay inside the grid (ridges, networks in 2-D) is multiplied by a
  positive-definite Gaussian taper first: cut off by the window it leaked and the sum diverged
  like ``log N``; tapered, the value never exceeds ``C_h`` beyond quadrature error (`fft_2d`).
* `monte_carlo` — importance sampling of the defining integral when the Fourier transform is
  known analytically, any ``q``, with a standard error; `gaussian_mixture_mc` builds the
  transform and the proposal for Gaussian mixtures.
* `network_upper_bound` — ``C_h <= sum_i |c_i| ||a_i|| C_sigma`` for a one-hidden-layer network
  ``h(x) = c_0 + sum_i c_i sigma(a_i . x + b_i)`` (ridge rule + subadditivity).  This bounds the
  constant of the *network*; for a network fitted to an unknown ``eta`` it is a surrogate, not a
  certificate of ``C_eta``.

`barron_constant` dispatches between them; for FFT it also compares against two coarser grids
and returns an `Estimate` with an ``error`` estimate and a ``converged`` flag (an unconverged
FFT value is not an estimate of ``C_h``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Literal, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special

from boundjax.core import options
from boundjax.core.validation import at_user_frame

Array = jax.Array

CATALAN = 0.915965594177219015054603514932384110774
_SQRT_2PI = math.sqrt(2.0 * math.pi)


# ----------------------------------------------------------------------------------------------
# Closed forms
# ----------------------------------------------------------------------------------------------

def _gaussian_bump(t):
  return jnp.exp(-0.5 * t * t)


def _sech(t):
  e = jnp.exp(-jnp.abs(t))  # overflow-free, and so is its derivative
  return 2.0 * e / (1.0 + e * e)


#: Ridge profiles ``g: R -> R`` with their Barron constants ``C_g``.
#: ``tanh_half`` is the paper's activation sigma(t) = (1 - e^-t)/(1 + e^-t) = tanh(t/2) (eq. 2).
PROFILES: dict[str, tuple[Callable[[Array], Array], float]] = {
    "tanh": (jnp.tanh, 1.0),
    "tanh_half": (lambda t: jnp.tanh(0.5 * t), 0.5),
    "logistic": (jax.nn.sigmoid, 0.25),
    "erf": (jax.scipy.special.erf, 2.0 / math.sqrt(math.pi)),
    "sech": (_sech, 8.0 * CATALAN / math.pi ** 2),
    "gaussian": (_gaussian_bump, math.sqrt(2.0 / math.pi)),
}


def profile(name: str) -> tuple[Callable[[Array], Array], float]:
  """Returns ``(g, C_g)`` for a named ridge profile / activation; `ValueError` if unknown.

  ReLU, leaky ReLU and other non-smooth activations have an infinite Barron constant (their
  derivative's Fourier transform is not integrable), so they are rejected by name.
  """
  if name in PROFILES:
    return PROFILES[name]
  if name in ("relu", "leaky_relu", "elu", "gelu", "abs", "hard_tanh"):
    raise ValueError(
        f"activation {name!r} has no finite Barron constant (|F(g')| is not integrable); "
        f"use one of {sorted(PROFILES)}.")
  raise ValueError(f"unknown profile/activation {name!r}; expected one of {sorted(PROFILES)}.")


@jax.jit
def gaussian_norm_mean(cov: Any) -> Array:
  """``E ||W||_2`` for ``W ~ N(0, cov)``, by a 1-D quadrature that is exact up to ~1e-12.

  Uses ``sqrt(x) = (2 sqrt(pi))^-1 int_0^inf (1 - e^{-s x}) s^{-3/2} ds`` and
  ``E exp(-s lambda Z^2) = (1 + 2 s lambda)^(-1/2)``, with ``s = e^u`` and the trapezoidal rule on
  ``u in [-80, 80]`` (the integrand decays like ``e^{-|u|/2}``; the rule converges geometrically
  for such analytic integrands). Jittable.
  """
  cov = jnp.atleast_2d(jnp.asarray(cov))
  lam = jnp.linalg.eigvalsh(cov)
  lam = jnp.clip(lam, 0.0, None)
  scale = jnp.mean(lam)
  lam = lam / scale
  u = jnp.linspace(-80.0, 80.0, 6401)
  log_prod = jnp.sum(-0.5 * jnp.log1p(2.0 * jnp.exp(u)[:, None] * lam[None, :]), axis=-1)
  f = -jnp.expm1(log_prod)  # 1 - prod_i (1 + 2 s lambda_i)^(-1/2), accurate at both ends
  integrand = f * jnp.exp(-0.5 * u)
  du = u[1] - u[0]
  integral = du * (jnp.sum(integrand) - 0.5 * (integrand[0] + integrand[-1]))
  return jnp.sqrt(scale) * integral / (2.0 * jnp.sqrt(jnp.pi))


def _concrete(tree: Any) -> bool:
  return not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))


def closed_form(kind: str, **p: Any) -> Array:
  """Barron constant in closed form; float64 unless called under a trace.

  Kinds and parameters:

  * ``"tanh" | "tanh_half" | "logistic" | "erf" | "sech"`` — the ridge ``g(a . x + b)`` with that
    profile: ``||a||_2 C_g`` with ``C_tanh = 1``, ``C_tanh_half = 1/2``, ``C_logistic = 1/4``,
    ``C_erf = 2/sqrt(pi)``, ``C_sech = 8G/pi^2`` (G = Catalan). ``a`` defaults to 1, ``b`` and the
    amplitude ``A`` (default 1) scale as ``|A|``. The paper's eq. 48 ``C_eta = <v, v0>`` must read
    ``|<v, v0>|`` (§5.2; a Barron constant is non-negative): we return the norm, never a signed
    value.
  * ``"gaussian"`` — ``A exp(-||x||^2 / (2 s^2))`` on ``R^q``:
    ``|A| sqrt(2) Gamma((q+1)/2) / (s Gamma(q/2))``. Parameters ``A=1, s=1, q=1``.
  * ``"gaussian_cov"`` — ``A exp(-x^T cov^-1 x / 2)``: ``|A| E ||W||``, ``W ~ N(0, cov^-1)``.
  * ``"ridge"`` — ``g(w . x + b)`` with ``profile`` a name from `PROFILES` or ``C_g`` given as
    ``profile_constant``: ``||w||_2 C_g``.

  Translation (``b``, centres) never changes the constant.

  Each kind takes only the keywords listed above (`CLOSED_FORM_KEYWORDS`): another one (e.g.
  ``mu`` for ``"tanh"``, whose ``tanh(mu t)`` of §5.2 is ``a=mu`` here) raises ``TypeError``
  naming it and the accepted ones, instead of being ignored. Concrete values are checked
  (`boundjax.core.options.OptionError`): NaN or ±inf anywhere; ``s > 0``; the dimension ``q``
  of ``R^q`` an integer >= 1 (``q=2.5`` is no dimension; it is not truncated to 2);
  ``profile_constant >= 0``.
  """
  _check_closed_form(kind, p)
  if _concrete(p):
    with jax.enable_x64(True):
      return _closed_form(kind, **p)
  return _closed_form(kind, **p)


#: The keywords `closed_form` takes for each kind (the first of a tuple in `_REQUIRED` must be
#: given).
CLOSED_FORM_KEYWORDS: dict[str, tuple[str, ...]] = {
    **{k: ("a", "b", "A") for k in ("tanh", "tanh_half", "logistic", "erf", "sech")},
    "gaussian": ("s", "q", "A"),
    "gaussian_cov": ("cov", "A"),
    "ridge": ("w", "b", "profile", "profile_constant", "A"),
}
_REQUIRED = {"gaussian_cov": ("cov",), "ridge": ("w",)}


def _check_closed_form(kind: str, p: dict[str, Any]) -> None:
  """The kind, its keywords and their concrete values (tracers pass unchecked)."""
  if kind not in CLOSED_FORM_KEYWORDS:
    raise ValueError(
        f"closed_form: unknown kind {kind!r}; expected tanh, tanh_half, logistic, erf, sech, "
        "gaussian, gaussian_cov or ridge.")
  options.no_unknown_keywords("closed_form", p, CLOSED_FORM_KEYWORDS[kind], case=f"kind={kind!r}")
  for name in _REQUIRED.get(kind, ()):
    if name not in p:
      raise TypeError(f"closed_form() with kind={kind!r} needs the keyword {name!r}"
                      f"{at_user_frame()}")
  for name in ("a", "b", "A", "w", "cov"):
    if name in p:
      _finite(name, p[name])
  if "s" in p:
    _finite("s", p["s"], positive=True)
  if "q" in p:
    options.integer("q", p["q"], minimum=1)
  if "profile_constant" in p:
    _finite("profile_constant", p["profile_constant"], nonnegative=True)


def _finite(name: str, value: Any, positive: bool = False, nonnegative: bool = False) -> None:
  """A finite scalar or array (each entry ``> 0`` / ``>= 0`` if asked); tracers pass."""
  if isinstance(value, jax.core.Tracer):
    return
  if np.ndim(value) == 0:
    options.number(name, value, positive=positive, nonnegative=nonnegative)
    return
  options.finite_array(name, value)
  if positive or nonnegative:
    flat = np.ravel(np.asarray(value))
    for i in np.flatnonzero(flat <= 0 if positive else flat < 0)[:1]:
      options.number(f"{name}[{int(i)}]", flat[i].item(), positive=positive,
                     nonnegative=nonnegative)


def _closed_form(kind: str, **p: Any) -> Array:
  amp = jnp.abs(jnp.asarray(p.get("A", 1.0), dtype=float))
  if kind in ("tanh", "tanh_half", "logistic", "erf", "sech"):
    a = jnp.atleast_1d(jnp.asarray(p.get("a", 1.0), dtype=float))
    return amp * jnp.linalg.norm(a) * PROFILES[kind][1]
  if kind == "gaussian":
    s = p.get("s", 1.0)
    q = int(p.get("q", 1))
    ratio = math.exp(math.lgamma((q + 1) / 2) - math.lgamma(q / 2))
    return amp * math.sqrt(2.0) * ratio / jnp.asarray(s, dtype=float)
  if kind == "gaussian_cov":
    cov = np.atleast_2d(np.asarray(p["cov"], dtype=float))
    if cov.shape[0] != cov.shape[1] or not np.allclose(cov, cov.T):
      raise ValueError(f"gaussian_cov: cov must be a symmetric square matrix, got shape {cov.shape}.")
    if np.linalg.eigvalsh(cov).min() <= 0:
      raise ValueError("gaussian_cov: cov must be positive definite.")
    return amp * gaussian_norm_mean(jnp.linalg.inv(jnp.asarray(cov)))
  if kind == "ridge":
    w = jnp.atleast_1d(jnp.asarray(p["w"], dtype=float))
    if "profile_constant" in p:
      cg = jnp.asarray(p["profile_constant"], dtype=float)
    else:
      cg = profile(p.get("profile", "tanh"))[1]
    return amp * jnp.linalg.norm(w) * cg
  raise AssertionError(kind)   # unreachable: `_check_closed_form` knows every kind


def network_upper_bound(w1: Any, w2: Any, activation: str = "tanh_half", b1: Any = None) -> Array:
  """Upper bound on the Barron constant of a one-hidden-layer network, from its weights.

  For ``h(x) = c_0 + sum_i c_i sigma(a_i . x + b_i)`` (paper eq. 5) the ridge rule and
  subadditivity give ``C_h <= C_sigma * sum_i |c_i| ||a_i||_2``; with
  sigma = tanh(t/2) this is ``(1/2) sum_i |c_i| ||a_i||``.

  Args:
    w1: first-layer kernel, shape ``[q, k]`` (Flax ``Dense`` layout: column i is ``a_i``).
    w2: output weights, shape ``[k]`` or ``[k, m]`` (one bound per output column).
    activation: a name from `PROFILES` (ReLU is rejected: infinite constant).
    b1: first-layer bias; accepted for signature symmetry, it never changes the bound.

  Returns:
    A scalar (``w2`` of shape ``[k]``) or an ``[m]`` vector of bounds.
  """
  del b1  # translation invariance
  _, c_sigma = profile(activation)
  if _concrete((w1, w2)):
    with jax.enable_x64(True):
      return _network_upper_bound(jnp.asarray(w1, float), jnp.asarray(w2, float), c_sigma)
  return _network_upper_bound(w1, w2, c_sigma)


def _network_upper_bound(w1: Any, w2: Any, c_sigma: float) -> Array:
  w1 = jnp.asarray(w1)
  w2 = jnp.asarray(w2)
  if w1.ndim == 1:
    w1 = w1[None, :]
  if w1.ndim != 2:
    raise ValueError(f"network_upper_bound: w1 must have shape [q, k], got {w1.shape}.")
  k = w1.shape[1]
  if w2.shape[0] != k:
    raise ValueError(
        f"network_upper_bound: w2 has {w2.shape[0]} rows but w1 has k={k} hidden units.")
  a_norm = jnp.linalg.norm(w1, axis=0)
  if w2.ndim == 1:
    return c_sigma * jnp.sum(jnp.abs(w2) * a_norm)
  return c_sigma * jnp.einsum("km,k->m", jnp.abs(w2), a_norm)


def staircase_network_1d(h: Callable, dh: Callable, lo: float, hi: float, k: int,
                         sharpness: float | None = None, grid: int = 200_001) -> dict:
  """A width-``k`` network of eq. 5 approximating ``h`` on ``[lo, hi]`` (Barron's Prop. 1, 1-D).

  Writes ``h(t) = h(lo) + int_lo^hi h'(s) 1{t > s} ds`` and quantises the measure ``h'(s) ds``
  into ``k`` pieces of equal mass ``TV/k``: unit ``i`` is a steep ``tanh(./2)`` step at the
  piece's median with output weight ``c_i = w_i / 2`` (``w_i`` the signed mass), so
  ``sum_i |c_i| = TV(h; [lo, hi]) / 2 <= (hi - lo) sup|h'| / 2 <= Dia C_h / 2`` — within
  Prop. 1's coefficient budget ``Dia C_h`` — and the sup error away from the steps is
  ``<= TV / k``. Deterministic stand-in for the Maurey sampling behind Barron's theorem (the paper's
  Prop. 1, §2).

  Returns params ``{"a": [1, k], "b": [k], "c": [k], "c0": []}`` for `auditing.adversary_apply`.
  """
  if k < 1 or not hi > lo:
    raise ValueError(f"staircase_network_1d: need k >= 1 and hi > lo, got k={k}, [{lo}, {hi}].")
  with jax.enable_x64(True):
    s = np.linspace(lo, hi, grid)
    d = np.asarray(dh(jnp.asarray(s)), float)
    ds = s[1] - s[0]
    mass = np.concatenate([[0.0], np.cumsum(0.5 * (np.abs(d[1:]) + np.abs(d[:-1])) * ds)])
    signed = np.concatenate([[0.0], np.cumsum(0.5 * (d[1:] + d[:-1]) * ds)])
    tv = mass[-1]
    edges = np.interp(np.linspace(0.0, tv, k + 1), mass, s) if tv > 0 else np.linspace(lo, hi, k + 1)
    w = np.diff(np.interp(edges, s, signed))
    mids = np.interp(0.5 * (edges[1:] + edges[:-1]), s, s) if tv == 0 else np.interp(
        np.linspace(0.0, tv, 2 * k + 1)[1::2], mass, s)
    A = sharpness if sharpness is not None else 200.0 * k / (hi - lo)
    h_lo = float(h(jnp.asarray(lo)))
  return {"a": np.full((1, k), A, np.float32), "b": (-A * mids).astype(np.float32),
          "c": (0.5 * w).astype(np.float32), "c0": np.float32(h_lo + 0.5 * np.sum(w))}


# ----------------------------------------------------------------------------------------------
# FFT quadrature
# ----------------------------------------------------------------------------------------------

def _unitary_fft_abs_sum(y: Array, dt: Array, axes: tuple[int, ...]) -> tuple[Array, Array]:
  """|unitary FT| of samples ``y`` on a centred grid of spacing ``dt``, and the omega spacing."""
  q = len(axes)
  n = y.shape[axes[0]]
  y = jnp.fft.ifftshift(y, axes=axes)
  yh = jnp.fft.fftn(y, axes=axes) * (dt / _SQRT_2PI) ** q
  dw = 2.0 * jnp.pi / (n * dt)
  return jnp.abs(yh), dw


def _grid_1d(L, N: int):
  dt = 2.0 * L / N
  return (jnp.arange(N) - N // 2) * dt, dt


def _omega_1d(N: int, dt):
  return jnp.fft.fftfreq(N) * (2.0 * jnp.pi / dt)


#: Gaussian taper width: ``sigma = L / _TAPER_WIDTHS``, so the taper is ``exp(-24.5) ~ 2e-11``
#: at the grid border ``+-L``.
_TAPER_WIDTHS = 7.0
#: ``"auto"`` tapers along an axis when ``|grad h|`` on either grid face of that axis exceeds this
#: fraction of its maximum over the grid (the gradient does not decay inside the window).
_TAPER_TRIGGER = 1e-3
_TAPERS = ("auto", "none", "gaussian")


def _check_grid(N: int, L: float, taper: str, fn: str) -> None:
  """ValueError (naming ``fn``) unless the FFT grid is N >= 16 points, a power of two, over a
  half-width L > 0, with a known ``taper``."""
  if N < 16 or N & (N - 1):
    raise ValueError(f"{fn}: N must be a power of two >= 16, got {N}.")
  if not L > 0:
    raise ValueError(f"{fn}: L must be > 0, got {L}.")
  _check_taper(taper, fn)


def _check_taper(taper: str, fn: str) -> None:
  if taper not in _TAPERS:
    raise ValueError(f"{fn}: taper must be one of {_TAPERS}, got {taper!r}.")


def _taper_axis(t: Array, L: Array, face: Array, peak: Array, taper: str) -> Array:
  """Gaussian taper ``exp(-t^2 / (2 sigma^2))``, ``sigma = L / 7``, along one axis, or ones.

  ``face``: the largest ``|grad h|`` on the two grid faces of this axis; ``peak``: the largest
  over the grid. ``taper="auto"`` tapers iff ``face > 1e-3 peak`` (jittable: a ``where``).
  """
  sigma = L / _TAPER_WIDTHS
  chi = jnp.exp(-0.5 * (t / sigma) ** 2)
  if taper == "none":
    return jnp.ones_like(t)
  if taper == "gaussian":
    return chi
  return jnp.where(face > _TAPER_TRIGGER * peak, chi, jnp.ones_like(t))


def _fft_1d_single(h, dh, form, L, N, p, taper="auto"):
  t, dt = _grid_1d(L, N)
  if dh is not None:
    y = dh(t) if p is None else dh(t, p)
    form = "gradient"
  elif form == "gradient":
    g = jax.grad(h) if p is None else jax.grad(lambda s: h(s, p))
    y = jax.vmap(g)(t)
  else:
    y = h(t) if p is None else h(t, p)
  if form == "gradient":
    a = jnp.abs(y)
    y = y * _taper_axis(t, L, jnp.maximum(a[0], a[-1]), jnp.max(a), taper)
  mag, dw = _unitary_fft_abs_sum(y, dt, (0,))
  if form != "gradient":
    mag = mag * jnp.abs(_omega_1d(N, dt))
  return dw / _SQRT_2PI * jnp.sum(mag)


def fft_1d(h: Callable | None = None, dh: Callable | None = None, *, L: float = 200.0,
           N: int = 2 ** 20, form: Literal["gradient", "direct"] = "gradient",
           params: Any = None, x64: bool = True,
           taper: Literal["auto", "none", "gaussian"] = "auto") -> Array:
  """Barron constant of ``h: R -> R`` by FFT quadrature of eq. 7 (eq. 45 in gradient form).

  Samples on ``t_j = (j - N/2) dt``, ``dt = 2L/N``; the unitary transform at
  ``omega_k = 2 pi k / (N dt)`` is ``dt/sqrt(2 pi) * FFT``; then
  ``C ~ d omega / sqrt(2 pi) * sum_k |F(h')(omega_k)|`` (gradient form, eq. 45) or
  ``sum_k |omega_k| |h_hat(omega_k)|`` (``form="direct"``, only for integrable ``h``).

  Args:
    h: the function (jnp, vectorised or scalar: the gradient form uses ``jax.grad`` per point).
    dh: its derivative, if known (preferred for tanh-like ``h``: no autodiff, exact samples).
    L: half-width of the grid; ``|h'|`` (or ``|h|``) must be negligible at ``+-L``
      (for ``sech^2(mu t)`` take ``L >= 40/mu``).
    N: number of grid points (static); ``dt = 2L/N`` must resolve the smallest length scale.
    form: ``"gradient"`` (default) or ``"direct"``.
    params: optional pytree with a leading batch axis; then ``h(t, p)`` / ``dh(t, p)`` are
      evaluated for every ``p`` in one vmapped, jitted FFT and a vector of constants returned.
    x64: run in float64 (default; the accuracies quoted below assume it).
    taper: gradient form only; ``"auto"`` multiplies ``h'`` by a Gaussian taper when ``|h'|`` at
      ``+-L`` exceeds ``1e-3 max |h'|``, ``"gaussian"`` always, ``"none"`` never. See `fft_2d`
      for why (a window cut-off of a non-decaying ``h'`` leaks); the tapered value never
      exceeds ``C_h`` beyond quadrature error and tends to it as ``L`` grows.

  The grid truncation and omega resolution make this an *estimate* (errors ~1e-10 for tanh with
  ``N=2^22``, ~1e-4 relative for Gaussians), not a rigorous bound; `barron_constant` adds a
  resolution check and an error estimate.
  """
  if h is None and dh is None:
    raise ValueError("fft_1d: give h or dh.")
  if form not in ("gradient", "direct"):
    raise ValueError(f"fft_1d: form must be 'gradient' or 'direct', got {form!r}.")
  _check_grid(N, L, taper, "fft_1d")
  with jax.enable_x64(x64):
    fn = jax.jit(lambda L_, p: _fft_1d_single(h, dh, form, L_, N, p, taper))
    L_arr = jnp.asarray(L, dtype=float)
    if params is None:
      return fn(L_arr, None)
    return jax.jit(jax.vmap(lambda p: _fft_1d_single(h, dh, form, L_arr, N, p, taper)))(params)


def _fft_2d_single(h, grad_h, L, N, p=None, taper="auto"):
  t, dt = _grid_1d(L, N)
  x1, x2 = jnp.meshgrid(t, t, indexing="ij")
  pts = jnp.stack([x1.ravel(), x2.ravel()], axis=-1)
  if grad_h is not None:
    g = grad_h if p is None else (lambda x: grad_h(x, p))
  else:
    g = jax.grad(h) if p is None else jax.grad(lambda x: h(x, p))
  grads = jax.lax.map(jax.vmap(g), pts.reshape(N, N, 2))  # row by row: bounded memory
  norm = jnp.sqrt(jnp.sum(grads ** 2, axis=-1))
  peak = jnp.max(norm)
  chi0 = _taper_axis(t, L, jnp.maximum(jnp.max(norm[0]), jnp.max(norm[-1])), peak, taper)
  chi1 = _taper_axis(t, L, jnp.maximum(jnp.max(norm[:, 0]), jnp.max(norm[:, -1])), peak, taper)
  grads = grads * (chi0[:, None] * chi1[None, :])[..., None]
  mag, dw = _unitary_fft_abs_sum(jnp.moveaxis(grads, -1, 0), dt, (1, 2))
  return dw ** 2 / (2.0 * jnp.pi) * jnp.sum(jnp.sqrt(jnp.sum(mag ** 2, axis=0)))


def fft_2d(h: Callable | None = None, grad_h: Callable | None = None, *, L: float = 30.0,
           N: int = 1024, params: Any = None, x64: bool = True,
           taper: Literal["auto", "none", "gaussian"] = "auto") -> Array:
  """Barron constant of ``h: R^2 -> R`` by 2-D FFT of its gradient.

  ``C ~ (2 pi)^-1 d omega^2 sum_omega ||F(chi grad h)(omega)||_2`` on an ``N x N`` grid over
  ``[-L, L)^2``. ``h`` takes a point of shape ``[2]`` and returns a scalar; ``grad_h`` (optional)
  returns its gradient (else ``jax.grad(h)``). With ``params`` (a pytree with a leading batch
  axis) ``h(x, p)`` is evaluated for every ``p`` in one vmapped, jitted call (memory
  ``O(batch N^2)``). An estimate, not a bound.

  **Non-decaying gradients (ridges, networks).** The gradient of a ridge ``g(w . x + b)`` — and
  of every network of eq. 5 — does not decay along the ridge. The FFT sees the samples in
  ``[-L, L)^2`` as one period of a periodic function; for a ridge not parallel to an axis that
  periodic extension jumps at the border, the jump spreads spectral mass ``~ 1/|omega|`` over the
  whole grid, and ``sum |F|`` grows like ``log N`` instead of converging (an untapered
  ``tanh(x.w/2)``, ``|w| = 1``, exact ``1/2``, gave 1.46, 1.60, 1.74, 1.88 at
  ``N = 128 ... 1024``). ``chi`` is therefore a Gaussian taper
  ``chi(x) = prod_j exp(-x_j^2 / (2 sigma^2))``, ``sigma = L / 7``, applied along every axis on
  whose grid faces ``|grad h|`` exceeds ``1e-3`` of its maximum (``taper="auto"``; ``"gaussian"``
  always, ``"none"`` never); decaying gradients (bumps, axis-parallel ridges across the other
  axis) are left untouched. ``chi`` is positive definite (``F(chi) >= 0``) with ``chi(0) = 1``,
  so ``F(chi grad h) = (2 pi)^-1 F(chi) * F(grad h)`` and Young's inequality give
  ``(2 pi)^-1 int ||F(chi grad h)|| <= chi(0) C_h = C_h``: the tapered value never exceeds the
  true constant (up to quadrature error), is exact for a ridge through the origin with
  ``F(g') >= 0`` (tanh, logistic, erf), and tends to ``C_h`` from below as ``L -> inf``
  (``F(chi)`` is an approximate identity of width ``7/L``; ``tanh(x.w/2 + 0.1)`` gives
  0.4985, 0.4995, 0.5000 at ``L = 15, 30, 60``).
  """
  if h is None and grad_h is None:
    raise ValueError("fft_2d: give h or grad_h.")
  _check_grid(N, L, taper, "fft_2d")
  with jax.enable_x64(x64):
    L_arr = jnp.asarray(L, dtype=float)
    if params is None:
      return jax.jit(lambda L_: _fft_2d_single(h, grad_h, L_, N, None, taper))(L_arr)
    return jax.jit(jax.vmap(lambda p: _fft_2d_single(h, grad_h, L_arr, N, p, taper)))(params)


def fft_grid(values: Any, L: float, form: Literal["direct", "gradient"] = "direct",
             x64: bool = True) -> Array:
  """Barron constant of a function given by samples on the centred grid of `fft_1d`/`fft_2d`.

  ``values``: ``[N]`` (q = 1) or ``[N, N]`` (q = 2) samples of ``h`` at ``t_j = (j - N/2) 2L/N``
  (``form="direct"``; ``h`` must decay to 0 at the borders, e.g. ``h - c`` for a cut-off
  extension), or ``[q, N, ...]`` samples of ``grad h`` (``form="gradient"``). Used for data-driven
  ``eta``, where no callable exists; an estimate, not a bound.
  """
  with jax.enable_x64(x64):
    v = jnp.asarray(values, dtype=float)
    if form == "direct":
      q = v.ndim
      grads = None
    elif form == "gradient":
      q = v.ndim - 1
      if v.shape[0] != q:
        raise ValueError(f"fft_grid: gradient samples must have shape [q, N, ...], got {v.shape}.")
    else:
      raise ValueError(f"fft_grid: form must be 'direct' or 'gradient', got {form!r}.")
    if q not in (1, 2):
      raise ValueError(f"fft_grid: only q = 1, 2 grids are supported, got q={q}.")
    n = v.shape[-1]
    if any(d != n for d in v.shape[-q:]) or n < 16 or n & (n - 1):
      raise ValueError(f"fft_grid: grid sides must be equal powers of two >= 16, got {v.shape}.")
    dt = 2.0 * L / n
    if form == "direct":
      mag, dw = _unitary_fft_abs_sum(v, dt, tuple(range(q)))
      om = _omega_1d(n, dt)
      if q == 1:
        w = jnp.abs(om)
      else:
        w = jnp.sqrt(om[:, None] ** 2 + om[None, :] ** 2)
      total = jnp.sum(w * mag)
    else:
      mag, dw = _unitary_fft_abs_sum(v, dt, tuple(range(1, q + 1)))
      total = jnp.sum(jnp.sqrt(jnp.sum(mag ** 2, axis=0)))
    return dw ** q / (2.0 * jnp.pi) ** (q / 2) * total


def posdef_shortcut(dh: Callable, *, L: float = 200.0, N: int = 2 ** 20,
                    rtol: float = 1e-9) -> tuple[bool, Array]:
  """The paper's trick (§5.2, eqs. 46–48): if ``F(h') >= 0`` then ``C_h = h'(0)``.

  Checks the sign of the discrete transform of ``h'`` numerically (``min Re >= -rtol * max``
  and negligible imaginary part, i.e. ``h'`` even) and returns ``(applies, h'(0))``. True for
  tanh, logistic, erf; false for e.g. ``sech`` (whose derivative is odd).
  """
  with jax.enable_x64(True):
    t, dt = _grid_1d(jnp.asarray(L, dtype=float), N)
    y = dh(t)
    yh = jnp.fft.fft(jnp.fft.ifftshift(y)) * dt / _SQRT_2PI
    scale = jnp.max(jnp.abs(yh))
    ok = (jnp.min(yh.real) >= -rtol * scale) & (jnp.max(jnp.abs(yh.imag)) <= 1e-6 * scale)
    return bool(ok), dh(jnp.zeros(()))


# ----------------------------------------------------------------------------------------------
# Monte Carlo
# ----------------------------------------------------------------------------------------------

class Estimate(NamedTuple):
  """A Barron-constant estimate.

  Attributes:
    value: the estimate.
    stderr: Monte Carlo standard error (0 for closed forms and FFT).
    method: ``"closed"``, ``"fft"`` or ``"mc"``.
    error: FFT only: the resolution-check error estimate ``max(|C(L, N) - C(L, N/2)|,
      |C(L, N) - C(L/2, N/2)|, 1e-10 |C(L, N)|)`` (see `barron_constant`); 0 for closed forms
      and MC.
    converged: FFT only: ``error <= rtol |value| + atol``. An unconverged FFT value is not an
      estimate of ``C_h`` at all (it may exceed a proven upper bound); closed forms and MC are
      always ``True``.
  """
  value: Array
  stderr: Array
  method: str
  error: Array | float = 0.0
  converged: bool = True


def monte_carlo(key: Array, fourier: Callable[[Array], Array], sample: Callable[[Array, int], Array],
                log_prob: Callable[[Array], Array], num_samples: int = 10 ** 6,
                batch: int = 2 ** 16, x64: bool = True) -> Estimate:
  """Importance-sampling estimate of eq. 7 with a known transform ``h_hat``.

  ``C ~ mean_m ||omega_m|| |h_hat(omega_m)| / ((2 pi)^(q/2) p(omega_m))``, ``omega_m ~ p``.

  Args:
    key: PRNG key.
    fourier: ``omega [q] -> h_hat(omega)`` (complex or real), unitary convention (eq. 4).
    sample: ``(key, m) -> [m, q]`` draws from the proposal ``p``.
    log_prob: ``omega [q] -> log p(omega)``.
    num_samples: total draws (rounded up to whole batches).
    batch: draws per vmapped batch (memory control).

  Returns:
    `Estimate` with the standard error of the mean.
  """
  if num_samples < 2:
    raise ValueError(f"monte_carlo: num_samples must be >= 2, got {num_samples}.")
  batch = min(batch, num_samples)
  nb = -(-num_samples // batch)
  with jax.enable_x64(x64):
    def one(k):
      w = sample(k, batch)
      q = w.shape[-1]
      v = jax.vmap(lambda o: jnp.linalg.norm(o) * jnp.abs(fourier(o)) * jnp.exp(
          -log_prob(o) - 0.5 * q * jnp.log(2.0 * jnp.pi)))(w)
      return jnp.sum(v), jnp.sum(v * v)
    s, s2 = jax.jit(lambda ks: jax.lax.map(one, ks))(jax.random.split(key, nb))
    m = nb * batch
    mean = jnp.sum(s) / m
    var = jnp.maximum(jnp.sum(s2) / m - mean ** 2, 0.0) * m / (m - 1)
    return Estimate(mean, jnp.sqrt(var / m), "mc")


@dataclasses.dataclass(frozen=True)
class GaussianMixture:
  """``h(x) = sum_j w_j exp(-(x - m_j)^T S_j^-1 (x - m_j) / 2)`` on ``R^q``.

  ``h_hat(omega) = sum_j w_j |S_j|^(1/2) exp(-i omega . m_j - omega^T S_j omega / 2)``.
  """
  weights: Array  # [J]
  means: Array    # [J, q]
  covs: Array     # [J, q, q]

  def __post_init__(self):
    w = np.asarray(self.weights)
    m = np.asarray(self.means)
    c = np.asarray(self.covs)
    if m.ndim != 2 or c.ndim != 3 or w.shape != (m.shape[0],) or c.shape != (m.shape[0],) + (
        m.shape[1], m.shape[1]):
      raise ValueError(
          f"GaussianMixture: expected weights [J], means [J, q], covs [J, q, q]; got "
          f"{w.shape}, {m.shape}, {c.shape}.")
    if np.any(np.linalg.eigvalsh(c) <= 0):
      raise ValueError("GaussianMixture: every covariance must be positive definite.")

  def __call__(self, x: Array) -> Array:
    d = x[None, :] - self.means
    quad = jnp.einsum("ji,jik,jk->j", d, jnp.linalg.inv(self.covs), d)
    return jnp.sum(self.weights * jnp.exp(-0.5 * quad))

  def fourier(self, omega: Array) -> Array:
    sq = jnp.sqrt(jnp.linalg.det(self.covs))
    quad = jnp.einsum("i,jik,k->j", omega, self.covs, omega)
    phase = self.means @ omega
    return jnp.sum(self.weights * sq * jnp.exp(-0.5 * quad - 1j * phase))

  def triangle_bound(self) -> Array:
    """``sum_j |w_j| E ||W_j||``, ``W_j ~ N(0, S_j^-1)``: an exact upper bound (subadditivity)."""
    return sum(abs(float(w)) * gaussian_norm_mean(jnp.linalg.inv(c))
               for w, c in zip(np.asarray(self.weights), np.asarray(self.covs)))


def gaussian_mixture_mc(key: Array, mix: GaussianMixture, num_samples: int = 10 ** 6,
                        batch: int = 2 ** 16) -> Estimate:
  """MC estimate for a Gaussian mixture, proposal ``sum_j pi_j N(0, S_j^-1)``, ``pi ~ |w|``."""
  with jax.enable_x64(True):
    w = jnp.asarray(mix.weights, dtype=float)
    covs = jnp.asarray(mix.covs, dtype=float)
    prec = jnp.linalg.inv(covs)
    pi = jnp.abs(w) / jnp.sum(jnp.abs(w))
    chol = jnp.linalg.cholesky(prec)
    q = covs.shape[-1]
    logdet = jnp.linalg.slogdet(prec)[1]

    def sample(k, m):
      k1, k2 = jax.random.split(k)
      comp = jax.random.choice(k1, pi.shape[0], (m,), p=pi)
      z = jax.random.normal(k2, (m, q))
      return jnp.einsum("mij,mj->mi", chol[comp], z)

    def log_prob(o):
      quad = jnp.einsum("i,jik,k->j", o, covs, o)
      comps = jnp.log(pi) - 0.5 * (q * jnp.log(2 * jnp.pi) + logdet + quad)
      return jax.scipy.special.logsumexp(comps)

    m = GaussianMixture(w, jnp.asarray(mix.means, dtype=float), covs)
    return monte_carlo(key, m.fourier, sample, log_prob, num_samples, batch)


# ----------------------------------------------------------------------------------------------
# Dispatcher
# ----------------------------------------------------------------------------------------------

#: Floor of the FFT error estimate, relative: float64 round-off of the FFT sums (``N <= 2^22``).
_FFT_ROUNDOFF = 1e-10


def _fft_checked(run: Callable[[float, int], Array], L: float, N: int, rtol: float,
                 atol: float, strict: bool) -> Estimate:
  """``C(L, N)`` with the resolution check of `barron_constant`."""
  if N < 32 or N & (N - 1):
    raise ValueError(f"barron_constant: the FFT resolution check needs N >= 32, a power of two "
                     f"(it also evaluates N/2), got N={N}.")
  if not (rtol >= 0 and atol >= 0):
    raise ValueError(f"barron_constant: rtol and atol must be >= 0, got {rtol}, {atol}.")
  with jax.enable_x64(True):
    c = jnp.asarray(run(L, N))
    c_dt = jnp.asarray(run(L, N // 2))
    c_win = jnp.asarray(run(0.5 * L, N // 2))
    err = jnp.maximum(jnp.maximum(jnp.abs(c - c_dt), jnp.abs(c - c_win)),
                      _FFT_ROUNDOFF * jnp.abs(c))
    ok = bool(jnp.isfinite(c) & jnp.isfinite(err) & (err <= rtol * jnp.abs(c) + atol))
  if strict and not ok:
    raise ValueError(
        f"barron_constant: the FFT quadrature did not converge: C(L={L:g}, N={N}) = {float(c):.6g}, "
        f"C(L, N/2) = {float(c_dt):.6g}, C(L/2, N/2) = {float(c_win):.6g} (tolerance "
        f"{rtol:g} relative). Refine N or L if h is smooth with an integrable gradient "
        "transform; a non-smooth h (ReLU network) has an infinite Barron constant.")
  return Estimate(c, jnp.zeros(()), "fft", err, ok)


def barron_constant(h: Callable | None = None, *, q: int = 1,
                    method: Literal["auto", "closed", "fft", "mc"] = "auto",
                    kind: str | None = None, dh: Callable | None = None,
                    fourier: Callable | None = None, proposal: tuple[Callable, Callable] | None = None,
                    key: Array | None = None, L: float | None = None, N: int | None = None,
                    num_samples: int = 10 ** 6, rtol: float = 1e-2, atol: float = 1e-9,
                    strict: bool = False, **closed_params: Any) -> Estimate:
  """Barron constant ``C_h`` (eq. 7) of a JAX callable, by the cheapest applicable method.

  * ``method="closed"`` (or ``kind=...`` given): `closed_form` ``(kind, **closed_params)``.
  * ``method="fft"``: `fft_1d` for ``q == 1`` (``h`` or ``dh``), `fft_2d` for ``q == 2``.
  * ``method="mc"``: `monte_carlo`; needs ``fourier`` (the analytic transform) and ``key``;
    ``proposal=(sample, log_prob)`` defaults to ``N(0, I_q)``. A `GaussianMixture` ``h`` supplies
    both itself.
  * ``"auto"``: closed form if ``kind`` is given, MC for a `GaussianMixture` or when ``fourier``
    is given, FFT for ``q <= 2``, else a `ValueError`.

  **FFT resolution check.** The quadrature is only an estimate, and for functions it cannot
  represent (non-smooth ``h`` such as ReLU networks, whose constant is infinite; under-resolved
  or truncated gradients) it does not converge at all, so one number at one resolution can lie
  far above a proven upper bound. ``method="fft"`` therefore computes ``C(L, N)`` (the returned
  value) and two coarser grids: ``C(L, N/2)`` (``dt`` doubled: the omega range is halved, which
  exposes aliasing and spectral mass that keeps growing with the omega range) and
  ``C(L/2, N/2)`` (same ``dt``, half the window: exposes truncation of a slowly decaying
  gradient and the bias of the Gaussian taper of `fft_2d`). ``error`` is the larger of the two
  differences and of a round-off floor ``1e-10 |value|`` (for a geometrically converging
  quadrature an over-estimate of ``|C(L, N) - C_h|``; a heuristic, not a bound) and
  ``converged = error <= rtol |value| + atol``. We return the flagged `Estimate` rather than
  raise, so that callers can log it; ``strict=True`` raises `ValueError` instead of returning an
  unconverged value. Cost: 1.5 times one FFT (q = 2), 2 times (q = 1). An unconverged value must
  not be used as ``C_h``; a converged one is still an estimate, not a bound.

  Args:
    rtol, atol: convergence tolerance of the FFT check (defaults ``1e-2``, ``1e-9``).
    strict: raise `ValueError` when the FFT check fails.

  Returns:
    `Estimate(value, stderr, method, error, converged)`; ``stderr`` is 0 for closed forms and
    FFT, ``error`` is 0 and ``converged`` True for closed forms and Monte Carlo.
  """
  if method == "auto":
    if kind is not None:
      method = "closed"
    elif isinstance(h, GaussianMixture) or fourier is not None:
      method = "mc"
    elif q <= 2:
      method = "fft"
    else:
      raise ValueError(
          f"barron_constant: q={q} > 2 needs method='mc' with an analytic `fourier` transform "
          "(FFT quadrature is only implemented for q = 1, 2).")
  if method == "closed":
    if kind is None:
      raise ValueError("barron_constant: method='closed' needs kind=... (see closed_form).")
    if kind == "gaussian" and "q" not in closed_params:
      closed_params = dict(closed_params, q=q)     # the dimension of R^q given to this call
    return Estimate(closed_form(kind, **closed_params), jnp.zeros(()), "closed")
  if method == "fft":
    if q == 1:
      run = lambda L_, N_: fft_1d(h, dh, L=L_, N=N_)
      L, N = (200.0 if L is None else L), (2 ** 20 if N is None else N)
    elif q == 2:
      run = lambda L_, N_: fft_2d(h, L=L_, N=N_)
      L, N = (30.0 if L is None else L), (1024 if N is None else N)
    else:
      raise ValueError(f"barron_constant: FFT is implemented for q = 1, 2, got q={q}.")
    return _fft_checked(run, float(L), int(N), rtol, atol, strict)
  if method == "mc":
    if key is None:
      raise ValueError("barron_constant: method='mc' needs a PRNG key.")
    if isinstance(h, GaussianMixture):
      return gaussian_mixture_mc(key, h, num_samples)
    if fourier is None:
      raise ValueError("barron_constant: method='mc' needs the analytic transform `fourier`.")
    if proposal is None:
      proposal = (lambda k, m: jax.random.normal(k, (m, q)),
                  lambda o: -0.5 * jnp.sum(o * o) - 0.5 * q * jnp.log(2 * jnp.pi))
    return monte_carlo(key, fourier, proposal[0], proposal[1], num_samples)
  raise ValueError(f"barron_constant: unknown method {method!r}; expected auto, closed, fft, mc.")


__all__ = [
    "CATALAN", "PROFILES", "profile", "closed_form", "CLOSED_FORM_KEYWORDS",
    "gaussian_norm_mean", "network_upper_bound",
    "staircase_network_1d", "fft_1d", "fft_2d", "fft_grid", "posdef_shortcut", "Estimate", "monte_carlo", "GaussianMixture",
    "gaussian_mixture_mc", "barron_constant",
]
