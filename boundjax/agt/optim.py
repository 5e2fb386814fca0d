"""AGT's interval optimisers as optax-style ``(init, update)`` pairs (AGT, Alg. 1 line 10).

An optax ``GradientTransformation`` maps a gradient to an update; its interval counterpart here
maps the descent direction of one batch *and its bounds* (AGT, Thm 4.6:
`boundjax.agt.train.descent_directions`) to the next parameter box::

    tx = agt.bounded_adam(1e-3)                  # or bounded_sgd / bounded_sgdm / transform(cfg)
    state = tx.init(params)                      # count, moments and their bounds
    box = agt.point_box(params)                  # nominal params + [theta_L, theta_U]
    for xb, yb in batches:
      dirs = agt.descent_directions(apply_fn, cfg, box.params, box.bounds, xb, yb,
                                    backend="mlp")   # or "ibp" for any model
      box, state = tx.update(dirs, state, box)

``update(directions, state, box) -> (box, state)`` is pure and jittable and composes in any user
loop. By induction (AGT, Thm 4.5) the box holds every parameter vector that the same training
reaches on a neighbouring dataset, provided each step's true descent direction lies in
``[directions.lower, directions.upper]`` (which Thm 4.6 guarantees while the parameters are in
the box). Unlike optax the pair returns the new box, not an additive update: the lower bound
moves by the *upper* direction bound, and the L1 and weight-decay steps are interval functions.

Rules (the nominal parameters follow the concrete optimiser bit for bit):

* SGD: ``theta <- (1 - a lambda2) theta - a g``; L1 ``theta - a lambda1 sign(theta)`` by
  cases at zero (the public AGT code's options).
* SGD with momentum (torch convention): ``v <- mu v + (1 - d) g`` carried for the L, nominal
  and U sequences (valid since ``mu, 1 - d >= 0``; AGT, footnote 2); Nesterov ``g + mu v``.
* Adam (Kingma & Ba, "Adam", Alg. 1; optax's ``scale_by_adam``): ``m <- b1 m + (1 - b1) g`` is
  interval-affine; ``v <- b2 v + (1 - b2) g^2`` with the interval square
  ``[g]^2 = [min over [g_L, g_U] of g^2 (0 if it crosses 0), max(g_L^2, g_U^2)]``; bias
  corrections divide by positive constants; the step ``m_hat / (sqrt(v_hat) + eps)`` is an
  interval quotient with a positive denominator (`adam_interval_update`). It is intersected
  with ``|m_hat| / sqrt(v_hat) <= C_t`` (`adam_ratio_bound`), which holds for every gradient
  sequence, so a box whose ``v`` reaches 0 still moves by at most ``a C_t`` per step.
  ``weight_decay`` is AdamW's decoupled decay (``optax.adamw``), ``l2_reg`` the coupled one
  (``g + lambda2 theta`` before Adam).

``sound=True`` widens every interval update outward by a bound on its rounding error, so that
runs retrained in the same floating point stay inside the box.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, NamedTuple, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.core.interval import Interval, join_tree, split_tree

Array = jax.Array
#: A step size: a number or an optax-style schedule ``count -> step size`` (count from 0).
LearningRate = Union[float, Callable[[Array], Array]]
_tm = jax.tree_util.tree_map


class ParamBox(NamedTuple):
  """The parameters the pair updates, like optax's ``params``.

  Attributes:
    params: the nominal parameters (the model actually trained and deployed).
    bounds: a pytree like ``params`` with `Interval` leaves ``[theta_L, theta_U]``.
  """
  params: Any
  bounds: Any


class Directions(NamedTuple):
  """One batch's nominal descent direction and its bounds (AGT, Thm 4.6).

  `boundjax.agt.train.descent_directions` returns this triple (as a plain tuple).
  """
  nominal: Any
  lower: Any
  upper: Any


class BoundedState(NamedTuple):
  """State of a bounded optimiser (a pytree).

  Attributes:
    count: steps taken (drives the step-size schedule and Adam's bias correction).
    nominal: the nominal run's moments: ``()`` for SGD, ``(v,)`` for momentum, ``(m, v)``
      for Adam (pytrees like the parameters).
    lower, upper: bounds on the same moments over every neighbouring run.
  """
  count: Array
  nominal: tuple = ()
  lower: tuple = ()
  upper: tuple = ()


class BoundedTransformation(NamedTuple):
  """An optax-style pair: ``init(params) -> BoundedState`` and
  ``update(directions, state, box) -> (box, state)``."""
  init: Callable[[Any], BoundedState]
  update: Callable[[Any, BoundedState, ParamBox], tuple[ParamBox, BoundedState]]


def point_box(params: Any) -> ParamBox:
  """The box at the initialisation theta': the point ``[theta', theta']`` (AGT, Alg. 1)."""
  params = _tm(jnp.asarray, params)
  return ParamBox(params, _tm(lambda p: Interval(p, p, validate=False), params))


# ---------------------------------------------------------------------------------------------
# checks and shared pieces
# ---------------------------------------------------------------------------------------------

def _number(who: str, name: str, v: Any, lo: float, hi: float = math.inf,
            hi_open: bool = False, lo_open: bool = False) -> float:
  """``v`` as a float, or ``ValueError`` naming ``name`` unless it lies in the given range."""
  if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
    raise ValueError(f"{who}: {name} must be a finite number, got {v!r}.")
  v = float(v)
  if v < lo or (lo_open and v == lo) or v > hi or (hi_open and v == hi):
    left, right = "(" if lo_open else "[", ")" if hi_open else "]"
    raise ValueError(f"{who}: {name} must lie in {left}{lo}, {hi}{right}, got {v!r}.")
  return v


def _learning_rate(who: str, learning_rate: Any) -> LearningRate:
  if callable(learning_rate):
    return learning_rate
  return _number(who, "learning_rate", learning_rate, 0.0, lo_open=True)


def _sound(who: str, sound: Any) -> bool:
  if not isinstance(sound, bool):
    raise TypeError(f"{who}: sound must be a bool, got {sound!r}.")
  return sound


def _step_size(learning_rate: LearningRate, count: Array, dtype: Any) -> Array:
  """``alpha_n`` in the parameters' dtype (a schedule is called with the 0-based count)."""
  lr = learning_rate(count) if callable(learning_rate) else learning_rate
  return jnp.asarray(lr).astype(dtype)


def _dtype(tree: Any) -> Any:
  return jax.tree_util.tree_leaves(tree)[0].dtype


def _outward(sound: bool, lo: Any, hi: Any, *terms) -> tuple[Any, Any]:
  """Widens ``[lo, hi]`` by 4 eps (|lo|, |hi| + sum |terms|) (rounding of the update), if
  ``sound``."""
  if not sound:
    return lo, hi

  def w(l, h, *ts):
    eps = jnp.finfo(l.dtype).eps
    mag = jnp.maximum(jnp.abs(l), jnp.abs(h)) + sum(jnp.abs(t) for t in ts)
    return l - 4 * eps * mag, h + 4 * eps * mag
  lo2 = _tm(lambda l, h, *ts: w(l, h, *ts)[0], lo, hi, *terms)
  hi2 = _tm(lambda l, h, *ts: w(l, h, *ts)[1], lo, hi, *terms)
  return lo2, hi2


def _directions(directions: Sequence[Any]) -> tuple[Any, Any, Any]:
  if not isinstance(directions, (tuple, list)) or len(directions) != 3:
    raise TypeError("bounded update: directions must be the triple (nominal, lower, upper) "
                    f"of descent directions (Directions), got {type(directions).__name__}.")
  return tuple(directions)


def _box(box: Any) -> tuple[Any, Any, Any]:
  if not isinstance(box, tuple) or len(box) != 2:
    raise TypeError(f"bounded update: box must be a ParamBox(params, bounds), got "
                    f"{type(box).__name__}.")
  t_l, t_u = split_tree(box[1])
  return box[0], t_l, t_u


def _l1_step(t_l, t_u, t_n, lam):
  """Range of ``theta - lam * sign(theta)`` over ``[t_l, t_u]`` (lam = alpha * l1_reg)."""
  lo = t_l - lam * jnp.sign(t_l)
  lo = jnp.where((t_l <= 0) & (t_u > 0), jnp.minimum(lo, -lam), lo)
  hi = t_u - lam * jnp.sign(t_u)
  hi = jnp.where((t_l < 0) & (t_u >= 0), jnp.maximum(hi, lam), hi)
  return lo, hi, t_n - lam * jnp.sign(t_n)


def _descend(a: Array, sound: bool, start: tuple[Any, Any, Any], step: tuple[Any, Any, Any],
             t_l: Any, t_u: Any, *extra: Any) -> tuple[Any, Any, Any]:
  """The interval descent step (AGT, Alg. 1 line 10): from ``start = (s_n, s_L, s_U)`` along
  ``step = (u_n, u_L, u_U)``,

      theta <- s_n - a u_n,   theta_L <- s_L - a u_U,   theta_U <- s_U - a u_L

  (the lower end moves by the *upper* bound of the direction). With ``sound`` the new box is
  widened by `_outward` over the old box ``[t_l, t_u]``, the two steps ``a u_U``, ``a u_L``
  and any ``extra`` terms. Returns ``(theta, theta_L, theta_U)``.
  """
  (s_n, s_l, s_u), (u_n, u_l, u_u) = start, step
  new_n = _tm(lambda p, g: p - a * g, s_n, u_n)
  new_l = _tm(lambda p, g: p - a * g, s_l, u_u)
  new_u = _tm(lambda p, g: p - a * g, s_u, u_l)
  new_l, new_u = _outward(sound, new_l, new_u, t_l, t_u, _tm(lambda g: a * g, u_u),
                          _tm(lambda g: a * g, u_l), *extra)
  return new_n, new_l, new_u


def _zero_count() -> Array:
  return jnp.zeros((), jnp.int32)


# ---------------------------------------------------------------------------------------------
# SGD and SGD with momentum
# ---------------------------------------------------------------------------------------------

def bounded_sgd(learning_rate: LearningRate, *, l1_reg: float = 0.0, l2_reg: float = 0.0,
                sound: bool = False) -> BoundedTransformation:
  """Bounded SGD (AGT, Alg. 1 line 10): ``theta_L <- s theta_L - a D_U``,
  ``theta_U <- s theta_U - a D_L`` with ``s = 1 - a l2_reg`` (an interval scaling, exact for
  either sign of s), or the L1 step by cases at zero (the public AGT code's options).

  Args:
    learning_rate: step size, or a schedule ``count -> step size``.
    l1_reg: lambda of an L1 penalty (not with ``l2_reg``).
    l2_reg: lambda of an L2 penalty ``(lambda / 2) |theta|^2``.
    sound: widen each step outward by a bound on its rounding error.
  """
  who = "bounded_sgd"
  learning_rate = _learning_rate(who, learning_rate)
  l1 = _number(who, "l1_reg", l1_reg, 0.0)
  l2 = _number(who, "l2_reg", l2_reg, 0.0)
  sound = _sound(who, sound)
  if l1 and l2:
    raise ValueError(f"{who}: l1_reg cannot be combined with l2_reg (as in the public AGT code).")

  def init(params: Any) -> BoundedState:
    del params
    return BoundedState(_zero_count())

  def update(directions, state: BoundedState, box: ParamBox) -> tuple[ParamBox, BoundedState]:
    d_n, d_l, d_u = _directions(directions)
    t_n, t_l, t_u = _box(box)
    a = _step_size(learning_rate, state.count, _dtype(t_n))
    if l1:
      s_l = _tm(lambda l, u, n: _l1_step(l, u, n, a * l1)[0], t_l, t_u, t_n)
      s_u = _tm(lambda l, u, n: _l1_step(l, u, n, a * l1)[1], t_l, t_u, t_n)
      s_n = _tm(lambda l, u, n: _l1_step(l, u, n, a * l1)[2], t_l, t_u, t_n)
    else:
      s = 1.0 - a * l2
      # s [t_l, t_u] = [s t_l, s t_u] when s >= 0, else [s t_u, s t_l] (a * l2_reg > 1)
      s_l = _tm(lambda l, u: jnp.where(s >= 0, s * l, s * u), t_l, t_u)
      s_u = _tm(lambda l, u: jnp.where(s >= 0, s * u, s * l), t_l, t_u)
      s_n = _tm(lambda p: s * p, t_n)
    new_n, new_l, new_u = _descend(a, sound, (s_n, s_l, s_u), (d_n, d_l, d_u), t_l, t_u)
    return (ParamBox(new_n, join_tree(new_l, new_u)),
            state._replace(count=state.count + 1))
  return BoundedTransformation(init, update)


def bounded_sgdm(learning_rate: LearningRate, *, momentum: float, dampening: float = 0.0,
                 nesterov: bool = False, l2_reg: float = 0.0, sound: bool = False
                 ) -> BoundedTransformation:
  """Bounded SGD with momentum (torch convention, ``v_0 = 0``): ``g <- g + l2_reg theta``,
  ``v <- momentum v + (1 - dampening) g`` carried separately for the L, nominal and U
  sequences, Nesterov ``u = g + momentum v``, ``theta <- theta - a u`` (the public AGT code;
  AGT, footnote 2: valid since momentum and 1 - dampening are >= 0).

  Args:
    learning_rate: step size, or a schedule ``count -> step size``.
    momentum: in [0, 1).
    dampening: in [0, 1].
    nesterov: Nesterov momentum (needs momentum > 0 and dampening 0, as torch).
    l2_reg: lambda of an L2 penalty (gradient ``lambda theta``, increasing in theta).
    sound: widen each step outward by a bound on its rounding error.
  """
  who = "bounded_sgdm"
  learning_rate = _learning_rate(who, learning_rate)
  m = _number(who, "momentum", momentum, 0.0, 1.0, hi_open=True)
  damp = _number(who, "dampening", dampening, 0.0, 1.0)
  l2 = _number(who, "l2_reg", l2_reg, 0.0)
  sound = _sound(who, sound)
  if not isinstance(nesterov, bool):
    raise TypeError(f"{who}: nesterov must be a bool, got {nesterov!r}.")
  if nesterov and (m <= 0 or damp != 0):
    raise ValueError(f"{who}: nesterov needs momentum > 0 and dampening == 0 (as in "
                     "torch.optim.SGD).")

  def init(params: Any) -> BoundedState:
    z = _tm(jnp.zeros_like, params)
    return BoundedState(_zero_count(), (z,), (z,), (z,))

  def update(directions, state: BoundedState, box: ParamBox) -> tuple[ParamBox, BoundedState]:
    d_n, d_l, d_u = _directions(directions)
    t_n, t_l, t_u = _box(box)
    a = _step_size(learning_rate, state.count, _dtype(t_n))
    g_n = _tm(lambda g, p: g + l2 * p, d_n, t_n)
    g_l = _tm(lambda g, p: g + l2 * p, d_l, t_l)     # lambda * theta is increasing in theta
    g_u = _tm(lambda g, p: g + l2 * p, d_u, t_u)
    (v_n,), (v_l,), (v_u,) = state.nominal, state.lower, state.upper
    v_n, v_l, v_u = (_tm(lambda v, g: m * v + (1 - damp) * g, v, g)
                     for v, g in ((v_n, g_n), (v_l, g_l), (v_u, g_u)))
    if nesterov:
      u_n, u_l, u_u = (_tm(lambda g, v: g + m * v, g, v)
                       for g, v in ((g_n, v_n), (g_l, v_l), (g_u, v_u)))
    else:
      u_n, u_l, u_u = v_n, v_l, v_u
    new_n, new_l, new_u = _descend(a, sound, (t_n, t_l, t_u), (u_n, u_l, u_u), t_l, t_u)
    return (ParamBox(new_n, join_tree(new_l, new_u)),
            BoundedState(state.count + 1, (v_n,), (v_l,), (v_u,)))
  return BoundedTransformation(init, update)


# ---------------------------------------------------------------------------------------------
# Adam
# ---------------------------------------------------------------------------------------------

def interval_square(lo: Array, hi: Array) -> tuple[Array, Array]:
  """``{g^2 : lo <= g <= hi}``: ``[lo^2, hi^2]`` when ``lo >= 0``, ``[hi^2, lo^2]`` when
  ``hi <= 0``, else ``[0, max(lo^2, hi^2)]`` (the minimum at the 0 crossing)."""
  a, b = lo * lo, hi * hi
  sq_lo = jnp.where(lo >= 0, a, jnp.where(hi <= 0, b, jnp.zeros_like(a)))
  return sq_lo, jnp.maximum(a, b)


def bias_correction(decay: float, count: Array) -> Array:
  """``1 - decay^t`` for the 1-based step ``t = count`` (Adam, Alg. 1), computed as optax's
  ``scale_by_adam`` does, so that the nominal run equals ``optax.adam`` bit for bit."""
  return 1 - decay ** count


def adam_ratio_bound(count: Array, b1: float, b2: float, dtype: Any) -> Array:
  """``C_t >= |m_hat_t| / sqrt(v_hat_t)`` for EVERY gradient sequence (t = ``count`` >= 1).

  From ``m_t = (1 - b1) sum_j b1^j g_{t-j}`` and ``v_t = (1 - b2) sum_j b2^j g_{t-j}^2``
  (j = 0 .. t-1, Adam, §2), Cauchy-Schwarz with weights ``b2^j`` gives
  ``|m_t| <= (1 - b1) sqrt(S_t v_t / (1 - b2))``, ``S_t = sum_j (b1^2 / b2)^j``, so

      |m_hat_t| / sqrt(v_hat_t) <= (1 - b1) sqrt(S_t (1 - b2^t) / (1 - b2)) / (1 - b1^t),

  attained by ``g_{t-j} proportional to (b1 / b2)^j``. This is a sound form of Adam's "the
  effective step is bounded by about alpha" (Adam, §2.1). The constants are those of the
  floating-point run (``b1``, ``b2`` rounded to ``dtype``, the bias corrections as
  `bias_correction`), and the result is widened by ``8 (t + 2) eps`` relative for the rounding
  of the moment recursions. Infinite (no bound) when ``b2 == 0``.
  """
  if b2 == 0:
    return jnp.asarray(jnp.inf, dtype)
  b1d, b2d = float(np.asarray(b1, dtype)), float(np.asarray(b2, dtype))
  t = jnp.asarray(count).astype(dtype)
  r = b1d * b1d / b2d
  if r == 1.0:
    s = t
  elif r == 0.0:
    s = jnp.ones_like(t)
  else:
    s = jnp.expm1(t * math.log(r)) / (r - 1.0)      # sum_{j < t} r^j, accurate near r = 1
  bc1 = bias_correction(b1, count).astype(dtype)
  bc2 = bias_correction(b2, count).astype(dtype)
  c = (1.0 - b1d) * jnp.sqrt(s * bc2 / (1.0 - b2d)) / bc1
  return c * (1 + 8 * (t + 2) * jnp.finfo(dtype).eps)


class AdamInterval(NamedTuple):
  """Bounds after one Adam step (`adam_interval_update`): moments and the step direction."""
  m_lo: Array
  m_hi: Array
  v_lo: Array
  v_hi: Array
  u_lo: Array
  u_hi: Array


def adam_interval_update(g_lo: Array, g_hi: Array, m_lo: Array, m_hi: Array, v_lo: Array,
                         v_hi: Array, count: Array, b1: float, b2: float, eps: float,
                         sound: bool = False) -> AdamInterval:
  """One Adam step over boxes of (g, m, v), without the `adam_ratio_bound` clamp.

  ``m' = b1 m + (1 - b1) g`` (interval affine, b1 and 1 - b1 >= 0); ``v' = b2 v +
  (1 - b2) [g]^2`` (`interval_square`; ``v' >= 0``); ``m_hat = m' / (1 - b1^t)``,
  ``v_hat = v' / (1 - b2^t)`` (``t = count``, the 1-based step; positive divisors); the step
  ``u = m_hat / (sqrt(v_hat) + eps)`` is a quotient with a positive denominator
  ``D in [sqrt(v_hat_L) + eps, sqrt(v_hat_U) + eps]``: for fixed D it increases with m_hat, and
  for fixed m_hat it decreases with D when m_hat >= 0 and increases when m_hat < 0, so

      u_U = m_hat_U / D_L if m_hat_U >= 0 else m_hat_U / D_U
      u_L = m_hat_L / D_U if m_hat_L >= 0 else m_hat_L / D_L

  (Adam, Alg. 1; the arithmetic order of optax's ``scale_by_adam``). With ``sound`` each
  result is widened by a bound on its rounding error.
  """
  dtype = m_lo.dtype
  m_lo2 = (1 - b1) * g_lo + b1 * m_lo
  m_hi2 = (1 - b1) * g_hi + b1 * m_hi
  sq_lo, sq_hi = interval_square(g_lo, g_hi)
  v_lo2 = (1 - b2) * sq_lo + b2 * v_lo
  v_hi2 = (1 - b2) * sq_hi + b2 * v_hi
  m_lo2, m_hi2 = _outward(sound, m_lo2, m_hi2, b1 * m_lo, b1 * m_hi, g_lo, g_hi)
  v_lo2, v_hi2 = _outward(sound, v_lo2, v_hi2, b2 * v_hi, sq_hi)
  v_lo2 = jnp.maximum(v_lo2, 0)
  bc1 = bias_correction(b1, count).astype(dtype)
  bc2 = bias_correction(b2, count).astype(dtype)
  mh_lo, mh_hi = m_lo2 / bc1, m_hi2 / bc1
  d_lo = jnp.sqrt(v_lo2 / bc2) + eps
  d_hi = jnp.sqrt(v_hi2 / bc2) + eps
  u_hi = jnp.where(mh_hi >= 0, mh_hi / d_lo, mh_hi / d_hi)
  u_lo = jnp.where(mh_lo >= 0, mh_lo / d_hi, mh_lo / d_lo)
  if sound:   # division, square root, bias corrections: a few roundings, relative to |u|
    e = 16 * jnp.finfo(dtype).eps
    u_lo, u_hi = u_lo - e * jnp.abs(u_lo), u_hi + e * jnp.abs(u_hi)
  return AdamInterval(m_lo2, m_hi2, v_lo2, v_hi2, u_lo, u_hi)


def bounded_adam(learning_rate: LearningRate, *, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.0, l2_reg: float = 0.0,
                 sound: bool = False) -> BoundedTransformation:
  """Bounded Adam (Kingma & Ba, "Adam", Alg. 1, in optax's arithmetic) and AdamW.

  The nominal run is ``optax.adam(learning_rate, b1, b2, eps)`` (``weight_decay > 0``:
  ``optax.adamw(..., weight_decay=weight_decay)``; ``l2_reg > 0``: preceded by
  ``optax.add_decayed_weights(l2_reg)``) bit for bit. The bounds: ``g`` in
  ``[D_L + l2 theta_L, D_U + l2 theta_U]``, then `adam_interval_update`, the step intersected
  with ``[-C_t, C_t]`` (`adam_ratio_bound`), and

      theta_L <- theta_L - a (u_U + wd theta_L),   theta_U <- theta_U - a (u_L + wd theta_U)

  (each endpoint taken as the min / max over both ends of the box, sound for any a wd).

  Args:
    learning_rate: step size, or a schedule ``count -> step size``.
    b1, b2: moment decays in [0, 1).
    eps: > 0, added to ``sqrt(v_hat)`` (keeps the denominator of the interval quotient
      positive).
    weight_decay: AdamW's decoupled decay (>= 0).
    l2_reg: coupled L2 penalty (>= 0), added to the gradient before Adam.
    sound: widen each step outward by a bound on its rounding error.
  """
  who = "bounded_adam"
  learning_rate = _learning_rate(who, learning_rate)
  b1 = _number(who, "b1", b1, 0.0, 1.0, hi_open=True)
  b2 = _number(who, "b2", b2, 0.0, 1.0, hi_open=True)
  eps = _number(who, "eps", eps, 0.0, lo_open=True)
  wd = _number(who, "weight_decay", weight_decay, 0.0)
  l2 = _number(who, "l2_reg", l2_reg, 0.0)
  sound = _sound(who, sound)

  def init(params: Any) -> BoundedState:
    z = _tm(jnp.zeros_like, params)
    return BoundedState(_zero_count(), (z, z), (z, z), (z, z))

  def update(directions, state: BoundedState, box: ParamBox) -> tuple[ParamBox, BoundedState]:
    d_n, d_l, d_u = _directions(directions)
    t_n, t_l, t_u = _box(box)
    dtype = _dtype(t_n)
    a = _step_size(learning_rate, state.count, dtype)
    if l2:   # optax.add_decayed_weights: g + l2 * p (increasing in p)
      d_n = _tm(lambda g, p: g + l2 * p, d_n, t_n)
      d_l = _tm(lambda g, p: g + l2 * p, d_l, t_l)
      d_u = _tm(lambda g, p: g + l2 * p, d_u, t_u)
    count = state.count + 1
    (m_n, v_n), (m_l, v_l), (m_u, v_u) = state.nominal, state.lower, state.upper
    # the nominal run: optax.scale_by_adam, in its order of operations
    m_n = _tm(lambda g, t: (1 - b1) * (g ** 1) + b1 * t, d_n, m_n)
    v_n = _tm(lambda g, t: (1 - b2) * (g ** 2) + b2 * t, d_n, v_n)
    bc1, bc2 = bias_correction(b1, count), bias_correction(b2, count)
    u_n = _tm(lambda m, v: (m / bc1.astype(m.dtype)) / (jnp.sqrt(v / bc2.astype(v.dtype)) + eps),
              m_n, v_n)
    iv = _tm(lambda *xs: adam_interval_update(*xs, count, b1, b2, eps, sound),
             d_l, d_u, m_l, m_u, v_l, v_u)
    leaves = lambda f: _tm(f, iv, is_leaf=lambda x: isinstance(x, AdamInterval))  # noqa: E731
    c = adam_ratio_bound(count, b1, b2, dtype)
    u_lo = leaves(lambda r: jnp.maximum(r.u_lo, -c))
    u_hi = leaves(lambda r: jnp.minimum(r.u_hi, c))
    if wd:   # optax.adamw: u + wd * p, then p - a * (...)
      step = lambda p, u: p - a * (u + wd * p)  # noqa: E731
      new_n = _tm(step, t_n, u_n)
      new_l = _tm(lambda l, h, u: jnp.minimum(step(l, u), step(h, u)), t_l, t_u, u_hi)
      new_u = _tm(lambda l, h, u: jnp.maximum(step(l, u), step(h, u)), t_l, t_u, u_lo)
      new_l, new_u = _outward(sound, new_l, new_u, t_l, t_u, _tm(lambda u: a * u, u_hi),
                              _tm(lambda u: a * u, u_lo), _tm(lambda p: a * wd * p, t_l),
                              _tm(lambda p: a * wd * p, t_u))
    else:
      new_n, new_l, new_u = _descend(a, sound, (t_n, t_l, t_u), (u_n, u_lo, u_hi), t_l, t_u)
    new_state = BoundedState(count, (m_n, v_n),
                             (leaves(lambda r: r.m_lo), leaves(lambda r: r.v_lo)),
                             (leaves(lambda r: r.m_hi), leaves(lambda r: r.v_hi)))
    return ParamBox(new_n, join_tree(new_l, new_u)), new_state
  return BoundedTransformation(init, update)


def with_vacuity_check(tx: BoundedTransformation, *, every: int, apply_fn: Callable,
                       config: Any, x: Any, backend: str = "mlp",
                       rule: Any = None) -> BoundedTransformation:
  """``tx`` whose ``update`` also runs `boundjax.agt.diagnostics.check` (the vacuity check of
  `boundjax.agt.fit`) on the new box after every ``every``-th step (``count % every == 0``).

  The check runs on the host (``jax.debug.callback`` under a ``lax.cond``, so a jitted step
  stays jittable and only the checked steps leave the device): it warns with
  ``VacuousCertificateWarning`` when the box certifies fewer than ``rule.min_certified`` of the
  probe points ``x`` and raises ``BoxOverflowError`` (inside ``jit``: as the runtime error that
  carries its message) when an endpoint became infinite or NaN.

  Args:
    tx: a pair of this module (`bounded_sgd`, `bounded_adam`, `transform`, ...).
    every: check after every ``every`` steps (an int >= 1).
    apply_fn, config, x, backend, rule: as in `boundjax.agt.diagnostics.check` (``rule``
      default: ``VacuityCheck()``).
  """
  from boundjax.agt import diagnostics
  if isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 1:
    raise ValueError(f"with_vacuity_check: every must be an int >= 1, got {every!r}.")
  every = int(every)
  rule = diagnostics.VacuityCheck() if rule is None else rule
  probe = jnp.asarray(x)

  def host(count, params, bounds):
    diagnostics.check(ParamBox(params, bounds), probe, apply_fn=apply_fn, config=config,
                      backend=backend, rule=rule, step=int(count))

  def update(directions, state, box):
    new_box, new_state = tx.update(directions, state, box)
    count = jnp.asarray(new_state.count)
    jax.lax.cond(count % every == 0,
                 lambda c, p, b: jax.debug.callback(host, c, p, b, ordered=False),
                 lambda c, p, b: None, count, new_box.params, new_box.bounds)
    return new_box, new_state

  return BoundedTransformation(tx.init, update)


def transform(config: Any) -> BoundedTransformation:
  """The bounded optimiser of an `boundjax.agt.Config`: its ``optimizer`` ("sgd", "sgdm",
  "adam") with its step-size schedule (``Config.lr``), regularisation and ``sound`` mode.
  `boundjax.agt.fit` runs exactly this pair."""
  lr = config.lr
  if config.optimizer == "sgd":
    return bounded_sgd(lr, l1_reg=config.l1_reg, l2_reg=config.l2_reg, sound=config.sound)
  if config.optimizer == "sgdm":
    return bounded_sgdm(lr, momentum=config.momentum, dampening=config.dampening,
                        nesterov=config.nesterov, l2_reg=config.l2_reg, sound=config.sound)
  if config.optimizer == "adam":
    return bounded_adam(lr, b1=config.b1, b2=config.b2, eps=config.eps_adam,
                        weight_decay=config.weight_decay, l2_reg=config.l2_reg,
                        sound=config.sound)
  raise ValueError(f"transform: unknown optimizer {config.optimizer!r}.")
