"""Branch and bound by ReLU splitting (β-CROWN style), for networks with many inputs (MNIST).

Every bound comes from the engine (`boundjax.crown` with ``splits=True, beta=True``) applied
to ``g(x) = C f(x) - d``, ``f`` the extracted affine/ReLU chain in float64 (its weights, ``C``
and ``d`` are arguments, so one compilation serves every disjunct and network of a shape).
Root: α-CROWN on the output rows with every hidden layer's bounds optimised too (α-CROWN,
Xu et al. 2021, §3.2: ``alpha_intermediate``; CROWN's intermediate bounds met with them). A *domain* is a split mask per hidden layer; its intermediate bounds are the root's
clipped by its splits (given to the engine as known bounds with ``intermediate="ibp"``, which
meets them with a forward interval pass: β-CROWN's fast mode, Wang et al. 2021, §3.3) and its
output bound is optimised over α and the split multipliers β, warm-started from the parent's.
The search is `boundjax.verify.bab.search` with a `Heap` of domains keyed by their bound:
each round takes the ``batch // 2`` open domains with the lowest bounds (the hardest first),
splits each on the unstable neuron with the largest BaBSR-style score (Bunel et al. 2020,
§5.1: the part of the bound that the upper relaxation's intercept costs,
``max(-Λ_j, 0) · u_j (-l_j) / (u_j - l_j)``, ``Λ_j`` the coefficient of ``h_j``, the engine's
``info.relu_coeffs``), and bounds both children in one jitted batch. Domains whose bound is
> 0 (or whose splits are infeasible) are dropped; the minimiser of each linear bound (a box
corner, from ``info.input_coeffs``) is replayed as a counterexample candidate.

Cost (measured on the loaded 2-core machine, sound mode, a 784-256-256-10 chain, 256 domains
per round, 15 steps): 0.48 s per round against 0.26 s for the former dense float64 copy
(since deleted; it bounded the lower rows only), and 13 s of compilation against 4 s,
paid once per process and shape.

MILP refinement (Tjeng et al. 2019, §4.1; α,β-CROWN's MIP refinement of intermediate layers):
with a `MilpRefiner` of the region, a search still undecided after `REFINE_AFTER` of the time
(or whose frontier grew too large) has hidden layer 1's bounds tightened by one MILP per
unstable neuron and direction (`milp.tighten`, both cores, at most `REFINE_SHARE` of the time
left), the root is bounded again on them (the later layers' bounds tighten with them) and the
search goes on. The refined bounds hold on the whole region, so its other disjuncts start from
them. On ERAN's 9x200 network (index 2697, eps 0.015) the root's margins go from -12 ... -26 to
-1.03 ... +2.63: eight of nine disjuncts proved at the root, the ninth after 205 domains (unsat in
180 s on the 2-core machine; without it, a timeout at 300 s).

Leaves: a domain with no unstable neuron left is affine on its polytope, so one LP per row
decides it (`boundjax.verify.leaf`): its duals, given to the engine as β, make the engine's sound
bound the LP's value (β-CROWN's 10-15 steps of Adam may stop short of it), and a minimiser <= 0
is replayed. Only a leaf neither closes nor yields a counterexample ends the search.

MILP fallback (Tjeng et al. 2019, through `milp.property.check_property`): when the problem has
few unstable neurons, when the frontier grows past ``max_domains``, when a leaf stays open,
or when half of the time is gone, the exact MILP is run on the box with
the root's sound pre-activation bounds for the time that is left.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.core.errors import MemoryBudgetError
from boundjax.core.interval import Interval
from boundjax.core.transforms import affine_image
from boundjax.verify import bab, chain
from boundjax.verify.outcome import Deadline
from boundjax.verify.spec import Disjunct, Region


NO_RELU = "no-relu"
"""`split_search`'s ``how`` when the network has no ReLU node to split."""

DEEP = 3
"""Hidden layers from which the root optimises the intermediate bounds by default."""

_chain = chain.chain_fn
_params = chain.chain_params


def _bounder(sound: bool, intermediate: str, steps: int, lr: float,
             alpha_intermediate: bool = False):
  """The engine's bound of the chain with split constraints, β and the details."""
  return chain.bounder(sound, intermediate, steps, lr, beta=True,
                       alpha_intermediate=alpha_intermediate)


def _clip_np(lbs, ubs, splits):
  out_l, out_u = [], []
  for l, u, s in zip(lbs, ubs, splits):
    out_l.append(np.where(s > 0, np.maximum(l, 0.0), l))
    out_u.append(np.where(s < 0, np.minimum(u, 0.0), u))
  return out_l, out_u


def _scores(lams, lbs, ubs, splits, row):
  """BaBSR-style scores (B, total hidden), -inf where the neuron is stable or split."""
  out = []
  for lam, l, u, s in zip(lams, lbs, ubs, splits):
    lam_r = np.take_along_axis(lam, row[:, None, None], axis=1)[:, 0]
    unstable = (l < 0) & (u > 0) & (s == 0)
    width = np.where(unstable, u - l, 1.0)
    sc = np.maximum(-lam_r, 0.0) * u * (-l) / width + 1e-6 * np.abs(lam_r) * np.minimum(u, -l)
    out.append(np.where(unstable, sc, -np.inf))
  return np.concatenate(out, axis=1)


def _milp(net, region: Region, disjunct: Disjunct, lbs, ubs, deadline: Deadline, replay):
  """The exact MILP on the box with the root's hidden bounds (``lbs, ubs``, per layer of
  ``net``; None: the MILP computes its own); ``(status, cex)``."""
  try:
    from milp.property import check_property
  except ImportError:
    return "unknown", None
  left = deadline.remaining()
  if left <= 1.0:
    return "timeout", None
  bounds = None  # without the root's: the MILP's own (CROWN, met with IBP)
  if lbs is not None:
    w, b = net.layers[-1].w_lower, net.layers[-1].b_lower
    w = w.toarray() if hasattr(w, "toarray") else np.asarray(w)  # a scipy.sparse layer, too
    yl, yu = affine_image(w, b, np.maximum(lbs[-1], 0.0), np.maximum(ubs[-1], 0.0))
    bounds = [(l.copy(), u.copy()) for l, u in zip(lbs, ubs)] + [(yl, yu)]
  try:
    res = check_property(net, region.lower, region.upper, disjunct.C, disjunct.d,
                         time_limit=left, bounds=bounds)
  except MemoryBudgetError:  # the MILP's own big-M bounds of a large network do not fit
    return "unknown", None
  if res.status == "sat":
    hit = replay.find(Region(region.lower, region.upper, (disjunct,)),
                      np.asarray(res.counterexample)[None])
    return ("sat", hit) if hit is not None else ("unknown", None)
  return res.status, None


class Problem(NamedTuple):
  """What ReLU splitting needs of a network and one disjunct ``C y - d``: the bound functions'
  first argument, the root bound (α-CROWN of the whole box with every node's bounds and
  details), the domains' bound (``f(params, box, splits=, pre=, warm=)``: fast mode, the known
  bounds met with an interval pass, α and β optimised), a box of float64 ends in the bounds'
  dtype (outward), and the float64 outputs of points (None: every candidate is replayed)."""

  params: Any
  root: Callable
  domains: Callable
  box: Callable
  forward: Callable | None
  hidden: tuple | None = None  # hidden widths when the root always takes ``pre`` (a chain)


def chain_problem(lay: chain.Layers, C, d, *, sound: bool, root_steps: int, steps: int,
                  lr: float, root_alpha_intermediate: bool) -> Problem:
  """The dense float64 chain's problem (`chain.bounder`, one compilation per option set)."""
  box = lambda lo, hi: Interval(jnp.asarray(lo, jnp.float64), jnp.asarray(hi, jnp.float64))
  return Problem(_params(lay, C, d),
                 _bounder(sound, "crown", root_steps, lr, root_alpha_intermediate),
                 _bounder(sound, "ibp", steps, lr), box,
                 lambda xs: chain.forward_np(lay, xs), tuple(lay.hidden))


_ENGINE: dict = {}
_ENGINE_SIZE = 4


def _engine_fn(apply_fn: Callable, input_shape: tuple, key: str, sound: bool,
               intermediate: str, steps: int, lr: float, memory_bytes: int | None,
               alpha_intermediate: bool = False):
  """The engine's bound of ``C flatten(apply_fn(params, x)) - d`` on a batch of flattened
  boxes (float64 with ``sound``, see `engine_problem`, else float32) with split constraints,
  β and the details (``bj.crown(..., splits=True, beta=True, return_info=True)``), jitted,
  cached per architecture ``key`` and options."""
  ck = (key, input_shape, sound, intermediate, steps, lr, memory_bytes, alpha_intermediate)
  if ck not in _ENGINE:
    from boundjax.domains.linear import crown as engine_crown

    def g(p, xb):
      prm, C, d = p
      one = lambda x: C @ jnp.reshape(apply_fn(prm, jnp.reshape(x, input_shape)), (-1,)) - d
      return jax.vmap(one)(xb)

    budget = {} if memory_bytes is None else {"memory_bytes": memory_bytes}
    fn = engine_crown(g, batch_axis=0, sound=sound, intermediate=intermediate, splits=True,
                      beta=True, return_info=True, alpha_steps=steps, alpha_lr=lr,
                      alpha_objective="lower_only", alpha_intermediate=alpha_intermediate,
                      **budget)
    jitted = jax.jit(lambda p, box, pre, splits, warm: fn(p, box, pre=pre, splits=splits,
                                                          warm=warm))
    if len(_ENGINE) >= _ENGINE_SIZE:
      _ENGINE.pop(next(iter(_ENGINE)))
    _ENGINE[ck] = lambda p, box, pre=None, splits=None, warm=None: jitted(p, box, pre, splits,
                                                                          warm)
  return _ENGINE[ck]


def engine_problem(apply_fn: Callable, params: Any, input_shape, key: str, C, d, *,
                   sound: bool, root_steps: int, steps: int, lr: float,
                   memory_bytes: int | None = None,
                   root_alpha_intermediate: bool = False) -> Problem | None:
  """The problem on the network itself (convolutions, pooling, residual sums as they are: no
  densified chain), its bounds in the precision of `engine.bound_precision`: float64 with
  ``sound``; else float32, where the parameters must equal their float32 rounding (ONNX
  weights do) and ``C`` be exact in float32 (None otherwise). The root is α-CROWN on
  CROWN's intermediate bounds (``root_alpha_intermediate``: every layer's bounds optimised
  too; on OVAL21's ``cifar_base_kw`` it moved the root bound from -0.0223 to -0.0222 and left
  the 72 unstable neurons unstable, for a much longer compilation)."""
  from boundjax.verify import engine
  shape = tuple(int(s) for s in input_shape)
  if not sound and not engine.params_exact_f32(params):
    return None
  with engine.bound_precision(sound):
    spec = engine.engine_spec(C, d, sound)
    if spec is None:
      return None
    p = (engine.engine_params(params, sound), jnp.asarray(spec[0]), jnp.asarray(spec[1]))

  def box(lo, hi):
    with engine.bound_precision(sound):
      return engine.engine_box(lo, hi, sound)

  root = _engine_fn(apply_fn, shape, key, sound, "crown", root_steps, lr, memory_bytes,
                    alpha_intermediate=root_alpha_intermediate)
  domains = _engine_fn(apply_fn, shape, key, sound, "ibp", steps, lr, memory_bytes)
  return Problem(p, _in_precision(root, sound), _in_precision(domains, sound), box, None)


def _in_precision(fn: Callable, sound: bool) -> Callable:
  """``fn`` called within `engine.bound_precision` (thread-local, so set at every call)."""
  from boundjax.verify import engine

  def call(*args, **kwargs):
    with engine.bound_precision(sound):
      return fn(*args, **kwargs)
  return call


def milp_fallback(net: Any, region: Region, disjunct: Disjunct, replay: Any) -> Callable:
  """`split_search`'s ``milp`` on the point network ``net`` (`milp.network.Network`) with the
  MILP's own big-M bounds (a problem's node bounds need not be in ``net``'s layer order)."""
  return lambda lbs, ubs, dl: _milp(net, region, disjunct, None, None, dl, replay)


REFINE_AFTER = 0.3
"""The share of the time left that the search runs on the root's bounds before a `MilpRefiner`
refines them."""

REFINE_SHARE = 0.4
"""The share of the time left (after that first search) that the refinement may take."""

REFINE_SOLVE_SECONDS = 2.0
"""Per solve of the refinement. On ERAN's 9x200 network (index 2697, eps 0.015), HiGHS's dual
bound after 1 s is from before its root node is done (75 of 78 solves end with no incumbent;
mean unstable width of hidden layer 1 0.94 -> 0.88, root margins -7 ... -10); after 2 s it is
the bound it keeps until 3 s and 5 s (width 0.73, root margins -1.19 ... +2.49, eight of the
nine disjuncts proved)."""


class MilpRefiner:
  """The intermediate bounds of a chain refined by one MILP per neuron and direction
  (`milp.tighten.tighten_layer`; Tjeng et al. 2019, §4.1; α,β-CROWN's MIP refinement), for one
  region, shared by its disjuncts: the bounds of hidden layers ``1 .. layers`` (layer 0's, of
  one affine map of a box, are already exact), neurons in the order of their branching scores
  (those that cost the bound most first), the given time at most, on ``threads`` solver threads.

  ``known``: the tightest node bounds found on the region so far (``(lbs, ubs)``), set by the
  search after the refined root and read by the region's next disjuncts (None until then);
  ``tried``: whether a refinement ran (one per region).
  Call ``refiner(lbs, ubs, scores, deadline)`` with the root's bounds and scores per layer;
  returns the refined ``(lbs, ubs)`` (never looser), or None when nothing was refined (no
  unstable neuron, or no time).
  """

  def __init__(self, net: Any, region: Region, *, layers: int = 1,
               solve_seconds: float = REFINE_SOLVE_SECONDS, threads: int | None = None):
    import os
    self.net, self.region, self.layers = net, region, int(layers)
    self.solve_seconds = float(solve_seconds)
    self.threads = threads if threads is not None else max(1, min(os.cpu_count() or 1, 4))
    self.known: tuple | None = None
    self.tried = False
    self.solves = 0

  def __call__(self, lbs, ubs, scores, deadline: Deadline):
    from milp.tighten import tighten_layer
    import time
    self.tried = True
    end = time.monotonic() + deadline.remaining()
    bounds = [(np.asarray(l, np.float64).copy(), np.asarray(u, np.float64).copy())
              for l, u in zip(lbs, ubs)]
    changed = False
    for m in range(1, min(self.layers + 1, len(bounds))):
      if end - time.monotonic() < self.solve_seconds:
        break
      L, U = bounds[m]
      sc = np.where((L < 0) & (U > 0), np.nan_to_num(np.asarray(scores[m], np.float64),
                                                     neginf=0.0), -np.inf)
      order = [int(j) for j in np.argsort(-sc, kind="stable") if np.isfinite(sc[j])]
      if not order:
        continue
      L2, U2, n = tighten_layer(self.net, self.region.lower, self.region.upper, bounds, m,
                                order=order, time_limit=self.solve_seconds,
                                threads=self.threads, deadline=end)
      self.solves += n
      changed = changed or bool(np.any(L2 > L) or np.any(U2 < U))
      bounds[m] = (L2, U2)
    if not changed:
      return None
    return [l for l, _ in bounds], [u for _, u in bounds]


def relu_split(lay: chain.Layers, net: Any, region: Region, disjunct: Disjunct, replay: Any,
               deadline: Deadline, *, sound: bool = True, batch: int = 256,
               root_steps: int | None = None, steps: int = 15, lr: float = 0.1,
               root_alpha_intermediate: bool | None = None,
               max_domains: int = 20_000, milp_unstable: int = 40, use_milp: bool = True,
               progress: bool = False, report: Any = None,
               frontier_bytes: int | None = None,
               refine: "MilpRefiner | None" = None,
               leaf_lp: bool = True) -> tuple[str, Any, int, str]:
  """ReLU-splitting BaB for one region and one disjunct.

  ``root_alpha_intermediate``: the root's α-CROWN also optimises every hidden layer's own
  bounds (α-CROWN, Xu et al. 2021, §3.2; ``bj.crown(alpha_intermediate=True)``), and those
  tighter bounds are the ones every domain starts from (``info.pre``). On ERAN's 9×200 MNIST
  network (eps 0.015, index 1013) the root's bounds of the nine disjuncts go from -0.94 ... -5.26
  (CROWN intermediate bounds, 50 steps) to 0.41 ... 4.80: proven at the root, where the
  former search bounded 312 domains in 300 s without an answer. None (default): on chains with
  at least `DEEP` hidden layers; on shallower ones CROWN's intermediate bounds are nearly as
  tight (the first layer's are exact) and the optimisation's compilation, about twice the
  plain root's, is not paid (MNIST 256x2, 120 s limits). ``root_steps``: None, 20 steps with
  optimised intermediate bounds (each a whole CROWN pass), else 50.

  ``report``: a `boundjax.verify.outcome.Progress` kept up to date (stage ``"root"``,
  ``"relu-split"`` or ``"milp"``, the nodes bounded, the disjunct's certified margin: the
  root's bound, then the search's global lower bound, the smallest bound of the domains left).

  ``leaf_lp``: a domain left with no unstable neuron is decided by its LPs
  (`boundjax.verify.leaf`: their duals as β, their minimiser replayed) instead of ending the
  search.

  Returns ``(status, counterexample or None, nodes, how)`` with ``how`` in ``"bounds"``,
  ``"bab"``, ``"milp"``.
  """
  if root_alpha_intermediate is None:
    root_alpha_intermediate = len(lay.hidden) >= DEEP
  if root_steps is None:  # each step with optimised intermediate bounds is a whole CROWN pass
    root_steps = 20 if root_alpha_intermediate else 50
  problem = chain_problem(lay, disjunct.C, disjunct.d, sound=sound, root_steps=root_steps,
                          steps=steps, lr=lr, root_alpha_intermediate=root_alpha_intermediate)
  milp = None
  if use_milp:
    milp = lambda lbs, ubs, dl: _milp(net, region, disjunct, lbs, ubs, dl, replay)
  leaf = None
  if leaf_lp:
    from boundjax.verify.leaf import solve_leaf
    Ws = [np.asarray(w, np.float64) for w in lay.Ws]
    bs = [np.asarray(b, np.float64) for b in lay.bs]
    leaf = lambda splits, lbs, ubs: solve_leaf(Ws, bs, disjunct.C, disjunct.d, region.lower,
                                               region.upper, splits, lbs, ubs)
  return split_search(problem, region, disjunct, replay, deadline, batch=batch,
                      max_domains=max_domains, milp=milp, milp_unstable=milp_unstable,
                      progress=progress, report=report, frontier_bytes=frontier_bytes,
                      refine=refine, leaf=leaf)


def split_search(problem: Problem, region: Region, disjunct: Disjunct, replay: Any,
                 deadline: Deadline, *, batch: int = 256, max_domains: int = 20_000,
                 milp: Callable | None = None, milp_unstable: int = 40, progress: bool = False,
                 report: Any = None, frontier_bytes: int | None = None,
                 refine: "MilpRefiner | None" = None,
                 leaf: Callable | None = None) -> tuple[str, Any, int, str]:
  """ReLU splitting on ``problem`` (see `relu_split`): the root bound, then branch and bound
  over split domains in batches of ``batch``; the search stops past ``max_domains`` open
  domains or ``frontier_bytes`` of them (their splits, α and β). ``milp(lbs, ubs, deadline) -> (status, cex)``:
  the exact fallback on the root's node bounds (None: no fallback). ``refine``: a
  `MilpRefiner` of the region (None: no refinement). ``leaf(splits, lbs, ubs) -> Leaf``: the
  LPs of a domain with no unstable neuron (`boundjax.verify.leaf.solve_leaf`; None: such a
  domain ends the search). Returns ``(status, counterexample or None, nodes, how)``."""
  from boundjax.verify import engine
  f64 = any(getattr(a, "dtype", None) == jnp.float64
            for a in jax.tree_util.tree_leaves(problem.params))
  with engine.bound_precision(f64):
    return _split_search(problem, region, disjunct, replay, deadline, batch=batch,
                         max_domains=max_domains, milp=milp, milp_unstable=milp_unstable,
                         progress=progress, report=report, frontier_bytes=frontier_bytes,
                         refine=refine, leaf=leaf)


def _split_search(problem: Problem, region: Region, disjunct: Disjunct, replay: Any,
                  deadline: Deadline, *, batch: int = 256, max_domains: int = 20_000,
                  milp: Callable | None = None, milp_unstable: int = 40,
                  progress: bool = False, report: Any = None,
                  frontier_bytes: int | None = None,
                  refine: "MilpRefiner | None" = None,
                  leaf: Callable | None = None) -> tuple[str, Any, int, str]:
  """`split_search` in the problem's precision."""
  if report is None:
    from boundjax.verify.outcome import Progress
    report = Progress()
  report.stage = "root"
  p = problem.params
  lo, hi = np.asarray(region.lower[None], np.float64), np.asarray(region.upper[None], np.float64)
  prior = refine.known if refine is not None else None  # another disjunct's refined bounds
  best, lam0, lams, alphas, betas, root_l, root_u = _root(problem, lo, hi, prior)
  hidden = [int(l.size) for l in root_l]
  if not hidden:
    return "unknown", None, 1, NO_RELU
  # the neurons unstable at the root: the only ones whose α, β and scores a domain keeps (its
  # node bounds are met with the root's, so a neuron stable there is stable in every domain)
  keep = [np.flatnonzero((l < 0) & (u > 0)) for l, u in zip(root_l, root_u)]
  keep_all = np.concatenate([k + sum(hidden[:i]) for i, k in enumerate(keep)]).astype(np.int64)
  report.nodes += 1
  report.bound(disjunct, float(best.max()))
  if best.max() > 0:
    return "unsat", None, 1, "bounds"
  sub = Region(region.lower, region.upper, (disjunct,))

  def candidates(lam0_b, bnd_b):
    row = np.argmax(bnd_b, axis=1)
    lam = np.take_along_axis(np.asarray(lam0_b).reshape(len(bnd_b), bnd_b.shape[1], -1),
                             row[:, None, None], axis=1)[:, 0]
    xs = np.where(lam > 0, region.lower, region.upper)
    if problem.forward is None:
      return replay.find(sub, xs)
    hit_mask = disjunct.violated_by(problem.forward(xs))
    if np.any(hit_mask):
      return replay.find(sub, xs[hit_mask])
    return None

  hit = candidates(lam0, best)
  if hit is not None:
    return "sat", hit, 1, "bab"
  n_unstable = sum(int(np.sum((l < 0) & (u > 0))) for l, u in zip(root_l, root_u))
  if n_unstable == 0 and leaf is not None:  # affine on the box: its LP's minimiser decides
    out = leaf([np.zeros(n, np.int8) for n in hidden], root_l, root_u)
    hit = None if out.candidate is None else replay.find(sub, out.candidate[None])
    if hit is not None:
      return "sat", hit, 1, "bab"

  if milp is not None and n_unstable <= milp_unstable:
    report.stage = "milp"
    st, cex = milp(root_l, root_u, deadline)
    return st, cex, 1, "milp"

  # the search (`boundjax.verify.bab`): a node is a row of a column batch holding its split
  # signs, its α and β (the warm start of its children), its bound and its branching scores
  def root_node(best, lams, alphas, betas) -> tuple[np.ndarray, bab.Bounded]:
    """The root's branching scores (1, total hidden) and its node."""
    none = [np.zeros((1, n), np.int8) for n in hidden]
    cl, cu = _clip_np([l[None] for l in root_l], [u[None] for u in root_u], none)
    score = _scores([_rows(x) for x in lams], cl, cu, none, np.argmax(best, axis=1))
    return score, bab.Bounded(
        {"splits": tuple(none), "alpha": _stored(alphas, keep), "beta": _stored(betas, keep),
         "score": score[:, keep_all].astype(np.float32),
         "bound": best.max(axis=1)},
        priority=best.max(axis=1))

  offsets = np.cumsum([0] + list(hidden))
  root_score, root = root_node(best, lams, alphas, betas)
  box = problem.box(np.broadcast_to(lo, (batch, lo.shape[1])),
                    np.broadcast_to(hi, (batch, hi.shape[1])))
  dt = box.lower.dtype  # known bounds in the bound's dtype, rounded outward
  known = _known_of(root_l, root_u, batch, dt)
  bounder = problem.domains
  bar = None
  if progress:
    from tqdm.auto import tqdm
    bar = tqdm(desc="relu split", unit="dom", leave=False)

  def branch(nodes):
    """Both children (+1 active, then -1 inactive) of every node on its best-scored neuron;
    None (a leaf) when a node has no unstable neuron left."""
    score = nodes["score"]
    if np.any(np.all(~np.isfinite(score), axis=1)):
      return None
    k = len(score)
    choice = keep_all[np.argmax(score, axis=1)]
    layer_of = np.searchsorted(offsets, choice, side="right") - 1
    idx = choice - offsets[layer_of]
    splits = [np.concatenate([sp, sp]) for sp in nodes["splits"]]
    for sign, rows in ((1, np.arange(k)), (-1, np.arange(k, 2 * k))):
      for m in range(len(hidden)):
        sel = layer_of == m
        splits[m][rows[sel], idx[sel]] = sign
    twice = lambda xs: tuple(np.concatenate([x, x]) for x in xs)
    return {"splits": tuple(splits), "alpha": twice(nodes["alpha"]), "beta": twice(nodes["beta"]),
            "parent": np.concatenate([nodes["bound"], nodes["bound"]])}

  def bound(children):
    """α-β-CROWN on a batch of children (padded to ``batch`` rows: one compilation), their
    corners replayed; a child is closed when every row's bound is > 0."""
    n = len(children["splits"][0])
    pad = batch - n

    def padded(x):
      return jnp.asarray(np.concatenate([x, np.repeat(x[-1:], pad, 0)]) if pad else x)

    out, inf = bounder(p, box, splits=[padded(x) for x in children["splits"]], pre=known,
                       warm=([padded(_warm(x, dt, k, h)) for x, k, h in
                              zip(children["alpha"], keep, hidden)],
                             [padded(_warm(x, dt, k, h)) for x, k, h in
                              zip(children["beta"], keep, hidden)]))
    bnd = np.asarray(out.lower, np.float64)[:n]
    bnd = np.where(np.isnan(bnd), -np.inf, bnd)
    report.nodes += n
    if bar is not None:
      bar.update(n)
    hit = candidates(np.asarray(inf.input_coeffs[0])[:n], bnd)
    if hit is not None:
      return bab.Bounded(None, counterexample=hit)
    cl, cu = _clip_np([np.broadcast_to(l, (n, l.size)) for l in root_l],
                      [np.broadcast_to(u, (n, u.size)) for u in root_u], children["splits"])
    score = _scores([_rows(x)[:n] for x in inf.relu_coeffs], cl, cu, children["splits"],
                    np.argmax(bnd, axis=1))
    # the parent's bound holds on its children's domains too (a child's own α-β optimisation
    # may end below it)
    low = np.maximum(bnd.max(axis=1), children["parent"])
    if leaf is not None:
      hit, low = settle_leaves(children, inf, cl, cu, np.all(~np.isfinite(score), axis=1), low)
      if hit is not None:
        return bab.Bounded(None, counterexample=hit)
    nodes = {"splits": children["splits"],
             "alpha": _stored(inf.alpha, keep, n), "beta": _stored(inf.beta, keep, n),
             "score": score[:, keep_all].astype(np.float32), "bound": low}
    return bab.Bounded(nodes, priority=low, closed=low > 0)

  def settle_leaves(children, inf, cl, cu, no_unstable, low):
    """The children with no unstable neuron and a bound <= 0, decided by their LPs: a
    minimiser that replays is returned as ``(hit, low)``; the others are bounded again by the
    engine from the LP's duals as β (`boundjax.verify.leaf`), their bounds raised to it."""
    n = len(low)
    rows = np.flatnonzero(no_unstable & (low <= 0))
    if not len(rows):
      return None, low
    betas = [np.array(np.asarray(b)[:n]) for b in inf.beta]
    todo = []
    for i in rows:
      if deadline.expired():
        break
      try:
        out = leaf([s[i] for s in children["splits"]], [l[i] for l in cl], [u[i] for u in cu])
      except ValueError:  # not a leaf after all (a NaN score): it stays open
        continue
      if out.candidate is not None:
        hit = replay.find(sub, out.candidate[None])
        if hit is not None:
          return hit, low
      if out.beta is not None:
        for k, b in enumerate(out.beta):
          betas[k][i, 0] = b.astype(betas[k].dtype)  # the lower rows' multipliers
        todo.append(i)
    low = low.copy()
    for at in range(0, len(todo), batch):
      idx = np.asarray(todo[at:at + batch])
      pad = batch - len(idx)
      take = lambda x: jnp.asarray(np.concatenate([x[idx], np.repeat(x[idx[-1:]], pad, 0)]))
      out, _ = bounder(p, box, splits=[take(np.asarray(x)) for x in children["splits"]],
                       pre=known, warm=([take(np.asarray(a)) for a in inf.alpha],
                                        [take(b) for b in betas]))
      again = np.asarray(out.lower, np.float64)[:len(idx)]
      again = np.where(np.isnan(again), -np.inf, again).max(axis=1)
      low[idx] = np.maximum(low[idx], again)
    return None, low

  nodes = 1

  def run(start, frontier, until):
    """The search from ``start`` on ``frontier`` until ``until``; its outcome and its decided
    verdict (None: not decided)."""
    nonlocal nodes
    report.stage = "relu-split"
    try:
      res = bab.search(start, bound, branch, frontier=frontier, batch=batch, pop=batch // 2,
                       deadline=until, max_frontier=max_domains, max_bytes=frontier_bytes)
    finally:
      if bar is not None:
        bar.close()
    nodes += res.bounded
    if res.reason != bab.COUNTEREXAMPLE:
      report.bound(disjunct, _global_lower(res))
    if res.reason == bab.COUNTEREXAMPLE:
      return res, ("sat", res.counterexample, nodes, "bab")
    if res.reason == bab.PROVED:
      return res, ("unsat", None, nodes, "bab")
    if deadline.expired():
      return res, ("timeout", None, nodes, "bab")
    return res, None

  start, frontier = root, bab.Heap()
  if refine is not None and not refine.tried and len(hidden) >= 2:
    # a first search on the root's bounds; undecided (out of its share of the time, or its
    # frontier too large), the intermediate bounds are refined by MILPs, the root is bounded
    # again on them, and the search goes on from where it stopped (from the new root when
    # its frontier was too large)
    res, verdict = run(start, frontier,
                       _Until(deadline.elapsed() + REFINE_AFTER * deadline.remaining(), deadline))
    if verdict is not None:
      return verdict
    start, frontier = bab.Parts(*res.pending), res.frontier
    better = None
    if res.reason in (bab.DEADLINE, bab.FRONTIER_LIMIT):
      report.stage = "refine"
      better = refine(root_l, root_u, np.split(root_score[0], offsets[1:-1]),
                      Deadline(REFINE_SHARE * deadline.remaining()))
    if better is not None:
      report.stage = "root"
      best, lam0, lams, alphas, betas, root_l, root_u = _root(problem, lo, hi, better)
      refine.known = (root_l, root_u)  # every bound holds on the region: for its other disjuncts
      known = _known_of(root_l, root_u, batch, dt)  # the search's from now on
      nodes += 1
      report.nodes += 1
      report.bound(disjunct, float(best.max()))
      if best.max() > 0:
        return "unsat", None, nodes, "bounds"
      hit = candidates(lam0, best)
      if hit is not None:
        return "sat", hit, nodes, "bab"
      if res.reason == bab.FRONTIER_LIMIT:
        root_score, start = root_node(best, lams, alphas, betas)
        frontier = bab.Heap()
    elif res.reason != bab.DEADLINE and milp is not None:  # a leaf or a frontier too large
      report.stage = "milp"
      st, cex = milp(root_l, root_u, deadline)
      return st, cex, nodes, "milp"

  # with the MILP to fall back on, branching gets half of the time that is left
  half = (_Until(deadline.elapsed() + 0.5 * deadline.remaining(), deadline) if milp is not None
          else deadline)
  res, verdict = run(start, frontier, half)
  if verdict is not None:
    return verdict
  if milp is not None:  # a leaf, a frontier over max_domains, or half of the time gone
    report.stage = "milp"
    st, cex = milp(root_l, root_u, deadline)
    if st != "unknown" or res.reason != bab.DEADLINE or deadline.expired():
      return st, cex, nodes, "milp"
    # the MILP could not run (its own bounds of a large network do not fit the memory): the
    # search goes on from where it stopped, for the time left
    res, verdict = run(bab.Parts(*res.pending), res.frontier, deadline)
    if verdict is not None:
      return verdict
  return ("unknown" if res.reason == bab.LEAF else bab.VERDICTS.get(res.reason, "unknown"),
          None, nodes, "bab")


def _root(problem: Problem, lo: np.ndarray, hi: np.ndarray, prior) -> tuple:
  """The root's bound on the box ``lo, hi`` (1, n_0), with ``prior`` ``(lbs, ubs)`` (per hidden
  layer, (n_i,) float64) as known bounds (None: none; a chain's root is always given ``pre``,
  infinite without a prior, so that both calls share one compilation). Returns ``(best (1, R),
  input coefficients, relu coefficients, α, β, lbs, ubs)``, the node bounds met with ``prior``."""
  box = problem.box(lo, hi)
  dt = box.lower.dtype
  pre = None
  if prior is not None:
    pre = [(jnp.asarray(_outward(np.asarray(l, np.float64)[None], dt, -1)),
            jnp.asarray(_outward(np.asarray(u, np.float64)[None], dt, 1))) for l, u in zip(*prior)]
  elif problem.hidden is not None:
    pre = [(jnp.full((1, n), -jnp.inf, dt), jnp.full((1, n), jnp.inf, dt))
           for n in problem.hidden]
  out, info = (problem.root(problem.params, box) if pre is None
               else problem.root(problem.params, box, pre=pre))
  best = np.asarray(out.lower, np.float64)
  best = np.where(np.isnan(best), -np.inf, best)
  lbs = [np.asarray(l, np.float64).reshape(1, -1)[0] for l, _ in info.pre]
  ubs = [np.asarray(u, np.float64).reshape(1, -1)[0] for _, u in info.pre]
  if prior is not None:
    lbs = [np.maximum(a, np.asarray(b, np.float64)) for a, b in zip(lbs, prior[0])]
    ubs = [np.minimum(a, np.asarray(b, np.float64)) for a, b in zip(ubs, prior[1])]
  return (best, np.asarray(info.input_coeffs[0]), info.relu_coeffs, info.alpha, info.beta,
          lbs, ubs)


def _stored(params, keep: list, n: int | None = None) -> tuple:
  """A node's α or β (per ReLU node ``(B, 2, m, n_i)``: lower rows, upper rows) as the frontier
  keeps them: the lower rows only (the search bounds ``C y - d`` from below), in float32, of
  the neurons ``keep[i]`` unstable at the root only (a stable neuron's α and an unsplit one's β
  have no effect). On OVAL21's ``cifar_wide_kw`` (6,244 neurons, 1,162 unstable at the root) a
  domain keeps a twentieth of the bytes of its float64 rows, so a frontier byte cap holds that
  many more domains. Any α in [0, 1] and β >= 0 is a valid warm start, so neither the rounding
  nor the zeros `_warm` puts back cost soundness."""
  return tuple(np.asarray(a)[:n, 0][..., k].astype(np.float32) for a, k in zip(params, keep))


def _warm(x: np.ndarray, dtype, keep: np.ndarray, size: int) -> np.ndarray:
  """A stored α or β (`_stored`) as the engine's warm start: ``size`` entries per row, the kept
  ones in place and 0 elsewhere, one side (the lower rows: the engine bounds them alone,
  ``alpha_objective="lower_only"``, or starts the upper rows from them)."""
  x = np.asarray(x, dtype)
  full = np.zeros(x.shape[:-1] + (size,), dtype)
  full[..., keep] = x
  return full[:, None]


def _known_of(lbs, ubs, batch: int, dtype) -> list:
  """Node bounds (per hidden layer, (n_i,) float64) as the domains' ``pre``: ``batch`` rows in
  ``dtype``, rounded outward."""
  return [(jnp.asarray(_outward(np.broadcast_to(l, (batch, l.size)), dtype, -1)),
           jnp.asarray(_outward(np.broadcast_to(u, (batch, u.size)), dtype, 1)))
          for l, u in zip(lbs, ubs)]


def _rows(x) -> np.ndarray:
  """A node's per-row coefficients ``(B, k, ...)`` as ``(B, k, n)`` float64."""
  x = np.asarray(x, np.float64)
  return x.reshape(x.shape[0], x.shape[1], -1)


def _outward(x: np.ndarray, dtype, direction: int) -> np.ndarray:
  """``x`` (float64) in ``dtype``, rounded down (``direction`` -1) or up (+1): a known lower
  (upper) bound stays one."""
  y = np.asarray(x, np.float64).astype(dtype)
  if np.dtype(dtype) == np.float64:
    return y
  back = y.astype(np.float64)
  bad = back > x if direction < 0 else back < x
  return np.where(bad, np.nextafter(y, np.asarray(direction * np.inf, dtype)), y).astype(dtype)


def _global_lower(res: Any) -> float:
  """The search's certified lower bound of the disjunct's margin: the smallest bound of the
  domains left on the frontier and of the last domains popped (a leaf, or a round the
  deadline stopped, leaves their children unbounded; each popped bound holds on its whole
  domain, so counting them is always sound); ``inf`` when the search proved the disjunct."""
  if res.reason == bab.PROVED:
    return float("inf")
  low = res.frontier.peek()
  if res.popped is not None and "bound" in res.popped and len(res.popped["bound"]):
    low = min(low, float(np.min(res.popped["bound"])))
  return float(low)


class _Until:
  """``remaining()`` until ``elapsed`` seconds into ``deadline`` (and never past it)."""

  def __init__(self, elapsed: float, deadline: Deadline):
    self.elapsed, self.deadline = elapsed, deadline

  def remaining(self) -> float:
    return min(self.elapsed - self.deadline.elapsed(), self.deadline.remaining())
