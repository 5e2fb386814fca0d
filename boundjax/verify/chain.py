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

Compilation is the cost that matters for short time limits. Measured on ACAS Xu (5-50x6-5, 8
rows, 64 boxes, sound CROWN with a prior; CPU seconds, so the machine's load does not count):
the engine's program compiles in 25-26 s (9,006 StableHLO lines, 24,745 after XLA's
optimisation: 467 fusions, 298 dot products) where the deleted hand-written copy compiled in
9 s (3,349 and 6,723 lines). Non-sound: 2,852 StableHLO lines against 1,396. Both walk the
same 28 (target, layer) steps of CROWN's intermediate passes; the engine emits about three
times the operations per step: separate backward steps (each with its rounding allowance,
matrix-vector products of magnitudes) for the product and the bias of every layer, both the
lower and the upper rows' bias sums at every ReLU, the interval pass in sound interval
arithmetic met with every CROWN bound, and the outward rounding of every relaxation's ends.
XLA's ``xla_backend_optimization_level=1`` saves nothing (24.5 s), ``=0`` compiles in about a
third of the time but runs 7x slower. What this module does instead: one compilation per
option set (`CHUNK`-sized calls, an infinite prior for none, the estimates sharing the sound
bound), under `jax.jit` (the engine's per-call checks at tracing only), in the background while
the attack runs (`warm_up`); `boundjax verify` keeps it in JAX's persistent cache for later
runs. The former copy compiled once per batch size (three) and per pass (up to four).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any, NamedTuple

import jax
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
_LOCKS: defaultdict = defaultdict(threading.Lock)  # per bounder: one compilation at a time


def bounder(sound: bool, intermediate: str = "crown", steps: int = 0, lr: float = 0.1,
            beta: bool = False, chunk: int | None = None, alpha_intermediate: bool = False):
  """The engine's bound of `chain_fn` with split constraints and known bounds
  (``bj.crown(..., splits=True, return_info=True)``), one transform per option set, called
  under `jax.jit` (one compilation per argument shape and structure; the engine's per-call
  argument checks, and its check that examples are independent, which runs ``chain_fn``
  op by op on a new shape, happen once at tracing: ``chain_fn`` treats rows independently by
  construction). ``steps``: α(β)-CROWN steps (0: CROWN). Call it as ``f(params, box, pre=,
  splits=)`` like the engine's function. ``chunk``: the engine's ``chunk_size`` (boxes per
  vmapped step; `memory.split_chunk` has checked that they fit), None: the engine's default
  (as many as fit its 1 GiB budget)."""
  key = (sound, intermediate, int(steps), float(lr), beta, chunk, alpha_intermediate)
  if key not in _BOUNDERS:
    opt = {"alpha": True, "alpha_steps": int(steps), "alpha_lr": lr, "beta": beta,
           "alpha_intermediate": alpha_intermediate} if steps else {}
    fn = crown(chain_fn, batch_axis=0, sound=sound, intermediate=intermediate, splits=True,
               return_info=True, chunk_size=chunk, **opt)
    jitted = jax.jit(lambda p, box, pre, splits, warm: fn(p, box, pre=pre, splits=splits,
                                                          warm=warm))
    _BOUNDERS[key] = lambda p, box, pre=None, splits=None, warm=None: jitted(p, box, pre,
                                                                             splits, warm)
  return _BOUNDERS[key]


CHUNK = 64
"""Boxes per call of a compiled bound: batches of any size run as chunks of this many (the last
padded), so each option set compiles once, whatever the batch sizes a search produces (a
compilation of the sound bound costs tens of seconds on a loaded 2-core CPU, more than running
1024 boxes; chunks of 64 run as fast per box as one call on 1024, measured on ACAS Xu). The
most: input splitting uses the largest power of two up to it that fits its memory budget
(`memory.split_chunk`)."""


def _known(prior, B: int, widths) -> list:
  """A prior ``(lbs, ubs)`` (per layer, (B, n)) as the engine's ``pre`` argument; without one,
  ``(-inf, +inf)`` (meeting with it changes nothing), so that every call has the same argument
  structure and shares one compilation."""
  if prior is None:
    return [(np.full((B, n), -np.inf), np.full((B, n), np.inf)) for n in widths]
  return [(np.asarray(l, F64), np.asarray(u, F64)) for l, u in zip(*prior)]


def _run(bound, lay: Layers, C, d, lo, hi, prior, splits, chunk: int = CHUNK):
  """``bound`` (a `bounder`) on the boxes ``lo, hi`` (B, n_0) in chunks of ``chunk`` boxes.
  Returns NumPy arrays ``(lower bounds (B, R), lam0 (B, R, n_0), infeasible (B,), lbs, ubs)``
  (``lbs, ubs``: the bounds the engine used per hidden layer, (B, n_i))."""
  with _LOCKS[id(bound)]:  # a `warm_up` compiling this bound: wait for it, do not compile twice
    return _run_chunks(bound, lay, C, d, lo, hi, prior, splits, chunk)


def _run_chunks(bound, lay: Layers, C, d, lo, hi, prior, splits, chunk: int):
  p = chain_params(lay, C, d)
  lo, hi = np.asarray(lo, F64), np.asarray(hi, F64)
  B = lo.shape[0]
  total = -(-B // chunk) * chunk
  pad = lambda a: np.concatenate([a, np.repeat(a[-1:], total - B, 0)]) if total > B else a
  lo, hi = pad(lo), pad(hi)
  pre = [(pad(l), pad(u)) for l, u in _known(prior, B, lay.hidden)]
  sp = None if splits is None else [pad(np.asarray(s, np.int8)) for s in splits]
  parts = []
  for s in range(0, total, chunk):
    cut = slice(s, s + chunk)
    out, info = bound(p, Interval(jnp.asarray(lo[cut]), jnp.asarray(hi[cut])),
                      pre=[(jnp.asarray(l[cut]), jnp.asarray(u[cut])) for l, u in pre],
                      splits=None if sp is None else [jnp.asarray(a[cut]) for a in sp])
    parts.append((out.lower, info.input_coeffs[0], info.infeasible,
                  [l for l, _ in info.pre], [u for _, u in info.pre]))
  cat = lambda xs: np.concatenate([np.asarray(x) for x in xs])[:B]
  bound_, lam0, inf = (cat([q[i] for q in parts]) for i in range(3))
  lbs = [cat([q[3][k] for q in parts]) for k in range(len(lay.hidden))]
  ubs = [cat([q[4][k] for q in parts]) for k in range(len(lay.hidden))]
  return bound_, lam0, inf, lbs, ubs


def crown_batch(lay: Layers, C, d, lo, hi, sound: bool, intermediate: str = "crown",
                prior=None, prior_mode: str = "layer", alpha_steps: int = 0, lr: float = 0.1,
                splits=None, chunk: int = CHUNK):
  """Lower bounds of ``C y - d`` on a batch of boxes ``lo, hi`` (B, n_0), by the engine.

  ``prior``: None or ``(lbs, ubs)`` per hidden layer (B, n_i), bounds known to hold on each
  box (its parent's). ``prior_mode="layer"``: met with the computed bounds layer by layer
  (each layer's pass sees the tighter bounds below it). ``"post"``: the box's own bounds are
  computed without them; the output rows are bounded twice, on the own bounds and on their
  intersection with ``prior`` (an interval pass met with it, then the output pass), and the
  larger bound is kept; the input coefficients are the first pass's, so branching is what it
  would be without a prior while every bound is at least as tight (the "layer" mode's
  coefficients made ACAS Xu 2_2 prop_1 need > 30k boxes instead of ~1.1k). ``intermediate``:
  the engine's ``"crown"`` or ``"ibp"``. ``alpha_steps``: α-CROWN on the output rows (then
  ``prior`` is ignored). ``splits``: None or split signs per hidden layer (B, n_i) (see
  `boundjax.crown`'s ``splits``). ``chunk``: boxes per call of the compiled bound (`CHUNK`,
  or a smaller power of two that fits a memory budget, `memory.split_chunk`). Every call runs
  in chunks of ``chunk`` boxes with the same argument structure (a missing prior is an
  infinite one), so one compilation per option set and chunk serves every batch size, prior
  or none, and `estimate_batch` in the same mode.

  Returns ``(bound (B, R), lam0 (B, R, n_0), infeasible (B,), lbs, ubs)`` as NumPy arrays
  (``lbs, ubs``: the tightest bounds known, to pass on as children's prior); infeasible boxes
  (empty met bounds) get bound ``+inf``."""
  if prior_mode not in ("layer", "post"):
    raise ValueError(f"crown_batch: prior_mode must be 'layer' or 'post', got {prior_mode!r}.")
  if alpha_steps:
    prior = None
  own = prior if prior_mode == "layer" else None
  bound, lam0, inf, lbs, ubs = _run(bounder(sound, intermediate, alpha_steps, lr, chunk=chunk),
                                    lay, C, d, lo, hi, own, splits, chunk)
  if prior is not None and prior_mode == "post":
    met = ([np.maximum(a, np.asarray(b)) for a, b in zip(lbs, prior[0])],
           [np.minimum(a, np.asarray(b)) for a, b in zip(ubs, prior[1])])
    bound2, _, inf2, lbs, ubs = _run(bounder(sound, "ibp", chunk=chunk), lay, C, d, lo, hi, met,
                                     splits, chunk)
    bound = np.maximum(bound, bound2)
    inf = inf | inf2
  bound = np.where(inf[:, None], np.inf, bound)
  return bound, lam0, inf, lbs, ubs


def estimate_batch(lay: Layers, C, d, lo, hi, prior, sound: bool = False,
                   chunk: int = CHUNK) -> np.ndarray:
  """Estimates of the lower bounds of ``C y - d`` (B, R) on boxes whose pre-activations are
  known to lie in ``prior`` (a parent box's bounds): CROWN met with ``prior`` layer by layer,
  only for ranking branching choices, never for a verdict. ``sound=True`` adds the rounding
  allowance (a few ulps) and shares the compilation of `crown_batch`'s sound bound: input
  splitting passes its own mode so that the look-ahead compiles nothing more."""
  bound, _, inf, _, _ = _run(bounder(sound, "crown", chunk=chunk), lay, C, d, lo, hi, prior,
                             None, chunk)
  return np.where(inf[:, None], np.inf, bound)


def warm_up(lay: Layers, rows: int, sound: bool, intermediate: str = "crown",
            chunk: int = CHUNK) -> threading.Event:
  """Compiles `crown_batch`'s bounds for ``lay`` and ``rows`` specification rows in a
  background thread, e.g. while the falsifier runs (a compilation takes tens of seconds on a
  loaded 2-core CPU and is single-threaded, as is the falsifier's phase, so on two cores they
  overlap): first the CROWN bound (no α), then the "post" mode's second pass (CROWN-IBP met
  with the prior). A `crown_batch` of these shapes called meanwhile waits for the compilation
  instead of compiling twice. Returns an event set when the first bound is ready (or failed).
  The thread is named like `engine.call_with_budget`'s workers, so `boundjax verify` exits at
  once if it is still compiling at the deadline. ``chunk``: `crown_batch`'s, so that the
  compiled shape is the one the search will call."""
  ready = threading.Event()

  def work():
    with jax.enable_x64(True):  # thread-local
      n_in, n_out = lay.widths[0], lay.widths[-1]
      C, d, box = np.zeros((rows, n_out)), np.zeros(rows), np.zeros((1, n_in))
      try:
        crown_batch(lay, C, d, box, box, sound, intermediate, chunk=chunk)
        ready.set()
        everything = ([np.full((1, n), -np.inf) for n in lay.hidden],
                      [np.full((1, n), np.inf) for n in lay.hidden])
        crown_batch(lay, C, d, box, box, sound, intermediate, everything, "post", chunk=chunk)
      except Exception:  # noqa: BLE001  (the real call reports it)
        pass
      finally:
        ready.set()
  threading.Thread(target=work, daemon=False, name="boundjax-worker").start()
  return ready
