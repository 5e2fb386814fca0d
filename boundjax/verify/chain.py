"""The verifier's dense affine/ReLU chain and its bounds, every one from the engine.

The chain is ``z_1 = W_0 x + b_0``, ``h_i = ReLU(z_i)``, ``z_{i+1} = W_i h_i + b_i``, output
``y = z_L`` (`Layers`, float64, extracted from a `milp.network.Network`). Bounds of a
specification ``C y - d`` on batches of boxes come from `boundjax.crown` applied to
`chain_fn` (weights, ``C`` and ``d`` are arguments, so one compilation serves every network,
property and disjunct of a shape): CROWN (Zhang et al. 2018, §3.3: the specification's rows are
bounded directly), α-CROWN (Xu et al. 2021), split constraints and β (Wang et al. 2021, §3.1),
and known intermediate bounds (a parent box's, which hold on its children) met with the
computed ones. Sound mode (``sound=True``) composes ``C`` and ``d`` into the function, so the
engine's outward rounding covers them; its bounds hold in exact arithmetic for the float64
chain.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from boundjax.core.interval import Interval
from boundjax.domains.linear import crown

F64 = np.float64


class Layers(NamedTuple):
  """A ReLU network's affine layers as float64 JAX arrays (a pytree)."""

  Ws: tuple  # (out, in) each
  bs: tuple  # (out,) each
  absWs: tuple  # |W|

  @property
  def widths(self) -> tuple[int, ...]:
    """``(n_0, n_1, ..., n_L)``: input size, hidden widths, output size."""
    return (int(self.Ws[0].shape[1]),) + tuple(int(w.shape[0]) for w in self.Ws)

  @property
  def hidden(self) -> tuple[int, ...]:
    return self.widths[1:-1]


def from_network(net: Any) -> Layers:
  """`Layers` of a point `milp.network.Network` (sparse layers densified). Call under x64."""
  import scipy.sparse as sp
  if not net.is_point:
    raise ValueError("the dense chain needs a network with point parameters.")
  Ws, bs = [], []
  for layer in net.layers:
    w = layer.w_lower.toarray() if sp.issparse(layer.w_lower) else layer.w_lower
    Ws.append(jnp.asarray(np.asarray(w, F64)))
    bs.append(jnp.asarray(np.asarray(layer.b_lower, F64)))
  return Layers(tuple(Ws), tuple(bs), tuple(jnp.abs(w) for w in Ws))


def forward(lay: Layers, x: jnp.ndarray) -> jnp.ndarray:
  """Outputs for inputs ``x`` of shape (..., n_0), in the arrays' dtype."""
  h = x
  for i, (w, b) in enumerate(zip(lay.Ws, lay.bs)):
    h = h @ w.T + b
    if i < len(lay.Ws) - 1:
      h = jnp.maximum(h, 0.0)
  return h


def forward_np(lay: Layers, x: np.ndarray) -> np.ndarray:
  """`forward` in NumPy float64, for candidate batches of varying sizes (op-by-op JAX would
  compile every primitive once per new shape)."""
  h = np.asarray(x, F64)
  for i, (w, b) in enumerate(zip(lay.Ws, lay.bs)):
    h = h @ np.asarray(w).T + np.asarray(b)
    if i < len(lay.Ws) - 1:
      h = np.maximum(h, 0.0)
  return h


def chain_fn(p: dict, x):
  """``C f(x) - d`` for the chain ``f`` (``x``: (batch, n_0); ``p``: ``W``, ``b``, ``C``,
  ``d``), the function the engine bounds. Its ReLU nodes are the hidden layers, in order."""
  h = x
  n = len(p["W"])
  for i, (w, b) in enumerate(zip(p["W"], p["b"])):
    h = h @ w.T + b
    if i < n - 1:
      h = jnp.maximum(h, 0.0)
  return h @ p["C"].T - p["d"]


def chain_params(lay: Layers, C, d) -> dict:
  """`chain_fn`'s parameters (float64)."""
  return {"W": tuple(lay.Ws), "b": tuple(lay.bs), "C": jnp.asarray(C, F64),
          "d": jnp.asarray(d, F64)}


_BOUNDERS: dict = {}


def bounder(sound: bool, intermediate: str = "crown", steps: int = 0, lr: float = 0.1,
            beta: bool = False):
  """The engine's bound of `chain_fn` with split constraints and known bounds
  (``bj.crown(..., splits=True, return_info=True)``), one transform (hence one compilation
  cache) per option set. ``steps``: α(β)-CROWN steps (0: CROWN)."""
  key = (sound, intermediate, int(steps), float(lr), beta)
  if key not in _BOUNDERS:
    opt = {"alpha": True, "alpha_steps": int(steps), "alpha_lr": lr, "beta": beta} if steps \
        else {}
    _BOUNDERS[key] = crown(chain_fn, batch_axis=0, sound=sound, intermediate=intermediate,
                           splits=True, return_info=True, **opt)
  return _BOUNDERS[key]


def _box(lo, hi) -> Interval:
  return Interval(jnp.asarray(lo, F64), jnp.asarray(hi, F64))


def _known(prior):
  """A prior ``(lbs, ubs)`` (per layer, (B, n)) as the engine's ``pre`` argument."""
  if prior is None:
    return None
  return [(jnp.asarray(l, F64), jnp.asarray(u, F64)) for l, u in zip(*prior)]


def crown_batch(lay: Layers, C, d, lo, hi, sound: bool, intermediate: str = "crown",
                prior=None, prior_mode: str = "layer", alpha_steps: int = 0, lr: float = 0.1,
                splits=None):
  """Lower bounds of ``C y - d`` on a batch of boxes ``lo, hi`` (B, n_0), by the engine.

  ``prior``: None or ``(lbs, ubs)`` per hidden layer (B, n_i), bounds known to hold on each
  box (its parent's). ``prior_mode="layer"``: met with the computed bounds layer by layer
  (each layer's pass sees the tighter bounds below it). ``"post"``: the box's own bounds are
  computed without them; the output rows are bounded twice, on the own bounds and on their
  intersection with ``prior`` (an interval pass met with it, then the output pass), and the
  larger bound is kept; the input coefficients are the first pass's, so branching is what it
  would be without a prior while every bound is at least as tight (the "layer" mode's
  coefficients made ACAS Xu 2_2 prop_1 need > 30k boxes instead of ~1.1k). ``alpha_steps``:
  α-CROWN on the output rows (then ``prior`` is ignored). ``splits``: None or split signs per
  hidden layer (B, n_i) (see `boundjax.crown`'s ``splits``).

  Returns ``(bound (B, R), lam0 (B, R, n_0), infeasible (B,), lbs, ubs)`` as NumPy arrays
  (``lbs, ubs``: the tightest bounds known, to pass on as children's prior); infeasible boxes
  (empty met bounds) get bound ``+inf``."""
  if prior_mode not in ("layer", "post"):
    raise ValueError(f"crown_batch: prior_mode must be 'layer' or 'post', got {prior_mode!r}.")
  p = chain_params(lay, C, d)
  box = _box(lo, hi)
  if alpha_steps:
    prior = None
  own = prior if prior_mode == "layer" else None
  sp = None if splits is None else [jnp.asarray(s, jnp.int8) for s in splits]
  out, info = bounder(sound, intermediate, alpha_steps, lr)(p, box, pre=_known(own), splits=sp)
  bound = np.asarray(out.lower)
  lam0 = np.asarray(info.input_coeffs[0])
  inf = np.asarray(info.infeasible)
  lbs = [np.asarray(l) for l, _ in info.pre]
  ubs = [np.asarray(u) for _, u in info.pre]
  if prior is not None and prior_mode == "post":
    met_l = [np.maximum(a, np.asarray(b)) for a, b in zip(lbs, prior[0])]
    met_u = [np.minimum(a, np.asarray(b)) for a, b in zip(ubs, prior[1])]
    out2, info2 = bounder(sound, "ibp")(p, box, pre=_known((met_l, met_u)), splits=sp)
    bound = np.maximum(bound, np.asarray(out2.lower))
    inf = inf | np.asarray(info2.infeasible)
    lbs = [np.asarray(l) for l, _ in info2.pre]
    ubs = [np.asarray(u) for _, u in info2.pre]
  bound = np.where(inf[:, None], np.inf, bound)
  return bound, lam0, inf, lbs, ubs


def estimate_batch(lay: Layers, C, d, lo, hi, prior) -> np.ndarray:
  """Estimates of the lower bounds of ``C y - d`` (B, R) on boxes whose pre-activations are
  known to lie in ``prior`` (a parent box's bounds): CROWN met with ``prior`` layer by layer,
  without the rounding allowance (``sound=False``): only for ranking branching choices, never
  for a verdict."""
  out, info = bounder(False, "crown")(chain_params(lay, C, d), _box(lo, hi), pre=_known(prior))
  return np.where(np.asarray(info.infeasible)[:, None], np.inf, np.asarray(out.lower))
