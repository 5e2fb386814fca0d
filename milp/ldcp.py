"""Local differential classification privacy (LDCP) by MILP (Sphynx, §3 and §5.2).

``N`` is LDCP at a neighbourhood ``I(x)`` with label ``y`` iff ``N`` and every leave-one-out
network ``T(D \\ {(x', y')})`` classify all of ``I(x)`` as ``y`` (Def. 2).

* `verify(model, params, hyper, nbhd, label)` — Sphynx's query: ``N`` itself and the
  hyper-network (one MILP each). The answer is ``"LDCP"`` only when both are VERIFIED. When the
  hyper-network's MILP finds a candidate, it is replayed through the real networks that are known
  (``members``): if one of them disagrees the answer is a *confirmed* ``"NOT_LDCP"``, otherwise
  ``"NOT_PROVEN"`` (Sphynx reports both as "not LDCP", a conservative answer; Sphynx, §4).
  With a predicted hyper-network (PredHyperNet) "LDCP" holds with high probability only; with
  the exact hyper-network (min/max over *all* members, `boundjax.hypernet.from_ensemble`) it is a
  proof: it has no false positives by construction.
* `verify_naive(model, family, nbhd, label)` — the ground truth: every member of a trained family
  checked on its own (the naive algorithm, Sphynx, §3 and §6). Fast paths, all sound: members are
  evaluated on sampled points of ``I(x)`` (a misclassified point ends the check: not LDCP,
  confirmed), and member-wise IBP or CROWN bounds (``bounds=``, vectorised over the family) verify members without a MILP;
  the rest get one MILP each, optionally in parallel (`boundjax.executor.Executor`).
* `sphynx(...)` — end to end: PredHyperNet from a growing sample of leave-one-out networks
  (`boundjax.hypernet.pred_hyper_net` over `boundjax.ensembles.train_ensemble`), then `verify`.

Arithmetic: the MILP and every replay use the networks' exact float32 parameters in float64.
The label defaults to ``class(N(x))``; Sphynx, §3, leaves the choice of ``y`` open.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import jax
import numpy as np

from boundjax.core import options
from boundjax.executor import Executor
from boundjax.models import dense_layers
from milp import network as net_lib
from milp import bounds as bounds_lib
from milp.network import Network
from milp.neighbourhoods import Neighbourhood
from milp.parallel import VerifyJob, run_job
from milp.solve import SolveConfig
from milp.verify import Status, VerifyResult, project
from milp.verify import verify as verify_net

PyTree = Any


# ------------------------------------------------------------------------------------------------
# Families of concrete networks (stacked parameters), vectorised
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Family:
  """Stacked concrete MLPs: ``ws[m]`` is ``(K, out, in)``, ``bs[m]`` is ``(K, out)`` (float64)."""

  ws: list[np.ndarray]
  bs: list[np.ndarray]
  output: str | None = None

  def __post_init__(self):
    if self.output is None:
      self.output = "sign" if self.ws[-1].shape[1] == 1 else "logits"

  @property
  def size(self) -> int:
    return int(self.ws[0].shape[0])

  def member(self, i: int) -> Network:
    layers = tuple(net_lib.AffineLayer.point(w[i], b[i]) for w, b in zip(self.ws, self.bs))
    return Network(layers, (self.ws[0].shape[2],), self.output)

  def select(self, rows: Any) -> "Family":
    rows = np.asarray(rows)
    return Family([w[rows] for w in self.ws], [b[rows] for b in self.bs], self.output)

  def outputs(self, xs: np.ndarray, chunk: int = 1024) -> np.ndarray:
    """``(K, n, out)`` outputs of every member on the flat inputs ``xs`` ``(n, d)``."""
    xs = np.asarray(xs, np.float64).reshape(len(xs), -1)
    res = []
    for s in range(0, self.size, chunk):
      h = xs[None]                                     # broadcast over members by matmul
      for m, (w, b) in enumerate(zip(self.ws, self.bs)):
        h = np.matmul(h, np.swapaxes(w[s:s + chunk], 1, 2)) + b[s:s + chunk, None, :]
        if m < len(self.ws) - 1:
          h = np.maximum(h, 0.0)
      res.append(h)
    return np.concatenate(res)

  def margin_lower_bounds(self, lo: np.ndarray, hi: np.ndarray, label: int,
                          method: str = "ibp", chunk: int = 1024) -> np.ndarray:
    """Per-member sound lower bound of the margin over the box ``[lo, hi]``.

    The margin rows (`margin_rows`: ``±y`` for a sign output, ``y_label - y_j`` for logits) are
    composed into each member's function and bounded by the engine in float64 sound mode
    (`milp.bounds.stacked_spec_bounds`, vmapped over the members in chunks of ``chunk``):
    ``method="ibp"`` interval bounds; ``"crown"`` the larger of IBP and CROWN (Zhang et al.
    2018, §3.3: the rows are the backward start ``Λ = C``). The margin is the smallest row."""
    if method not in ("ibp", "crown"):
      raise ValueError(f"margin_lower_bounds: unknown method {method!r}; use 'ibp' or 'crown'.")
    lo = np.asarray(lo, np.float64).reshape(-1)
    hi = np.asarray(hi, np.float64).reshape(-1)
    C = margin_rows(self.ws[-1].shape[1], label, self.output)
    step = max(1, min(int(chunk), self.size))
    out = []
    for s in range(0, self.size, step):
      rows = np.arange(s, s + step) % self.size  # the last chunk padded: one compiled shape
      sub = self.select(rows)
      L, _ = bounds_lib.stacked_spec_bounds(sub.ws, sub.bs, C, np.zeros(len(C)), lo, hi, method)
      out.append(np.min(L, axis=1)[:min(step, self.size - s)])
    return np.concatenate(out)


def margin_rows(n_out: int, label: int, output: str) -> np.ndarray:
  """The margin as rows ``C`` on the outputs, ``(R, n_out)``: the margin is ``min_r (C y)_r``
  (``sign(label) y`` for a sign output, ``y_label - y_j`` for each ``j != label`` for logits)."""
  if output == "sign":
    return np.array([[1.0 if label == 1 else -1.0]])
  others = [k for k in range(n_out) if k != label]
  C = np.zeros((len(others), n_out))
  C[:, label] = 1.0
  C[np.arange(len(others)), others] = -1.0
  return C


def family_from_stacked(stacked: PyTree, output: str | None = None) -> Family:
  """A `Family` from stacked MLP parameters (``Ensemble.params``: leading member axis)."""
  try:
    layers = dense_layers(stacked, stacked=True)
  except ValueError as e:
    raise ValueError(f"family_from_stacked: {e}") from None
  ws, bs = [], []
  for layer in layers:
    k = np.asarray(layer["kernel"], np.float64)
    ws.append(np.transpose(k, (0, 2, 1)).copy())
    bs.append(np.asarray(layer["bias"], np.float64))
  return Family(ws, bs, output)


def family_from_flat(rows: np.ndarray, like: PyTree, output: str | None = None) -> Family:
  """A `Family` from ``(K, P)`` flat parameter rows in pytree-leaf order of ``like``."""
  leaves, treedef = jax.tree_util.tree_flatten(like)
  rows = np.asarray(rows)
  out, start = [], 0
  for leaf in leaves:
    size = int(np.size(leaf))
    out.append(rows[:, start:start + size].reshape((rows.shape[0],) + np.shape(leaf)))
    start += size
  if start != rows.shape[1]:
    raise ValueError(f"family_from_flat: rows have {rows.shape[1]} parameters, template {start}.")
  return family_from_stacked(jax.tree_util.tree_unflatten(treedef, out), output)


def _network(model, params, input_shape, output) -> Network:
  if model is None:
    return net_lib.from_params(params, output)
  if input_shape is None:
    raise ValueError("ldcp: input_shape is required with a Flax model.")
  return net_lib.from_flax(model, params, input_shape, output)


def predicted_label(net: Network, x: np.ndarray) -> int:
  """``class(N(x))``, the default label (our choice; Sphynx, Def. 2, takes ``y`` as given)."""
  return int(net_lib.classify(net, net_lib.forward(net, x)[None])[0])


# ------------------------------------------------------------------------------------------------
# Sphynx query
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class LDCPResult:
  """Outcome of `verify`.

  Attributes:
    verdict: ``"LDCP"`` (N and the hyper-network VERIFIED), ``"NOT_LDCP"`` (a real network —
      N or a known member — misclassifies a point of the neighbourhood), ``"NOT_PROVEN"``
      (a hyper-network counterexample no known network reproduces, or a time-out).
    label: the label checked.
    n_result, hyper_result: the two verifications (``hyper_result`` is None when N already fails).
    counterexample: the input of a NOT_LDCP answer.
    seconds: wall-clock time of the whole query.
  """

  verdict: str
  label: int
  n_result: VerifyResult
  hyper_result: VerifyResult | None
  counterexample: np.ndarray | None
  seconds: float

  @property
  def ldcp(self) -> bool:
    return self.verdict == "LDCP"


def verify(model: Any, params: PyTree, hyper: PyTree, neighbourhood: Neighbourhood,
           label: int | None = None, *, members: Family | PyTree | None = None,
           cfg: SolveConfig = SolveConfig(), bounds: str = "ibp",
           input_shape: Sequence[int] | None = None, output: str | None = None,
           samples: int = 64) -> LDCPResult:
  """Sphynx's LDCP query: N and the hyper-network on one neighbourhood (Sphynx, §4).

  Args:
    model: the Flax linen module, or ``None`` for an MLP given by its parameter dict.
    params: N's parameters.
    hyper: the hyper-network (a pytree with `Interval` leaves, or a `Network`).
    neighbourhood: `milp.neighbourhoods` membership / L-inf ball / sensitive attribute.
    label: the class that must hold; default ``class(N(x))``.
    members: known real networks inside the family (stacked params or a `Family`), used to
      confirm a hyper-network counterexample.
    cfg, bounds: solver settings and big-M bounds (``"ibp"`` or ``"crown"``).
    input_shape: one input's shape, needed with ``model``.
    output: ``"logits"``, ``"sign"``, or ``None``: by the number of output units.
    samples: random points tried before each MILP.
  """
  t0 = time.perf_counter()
  n_net = _network(model, params, input_shape, output)
  h_net = hyper if isinstance(hyper, Network) else _network(model, hyper, input_shape, output)
  n_classes = 2 if n_net.output == "sign" else n_net.layers[-1].shape[0]
  label = predicted_label(n_net, neighbourhood.center.reshape(-1)) if label is None else \
      options.integer("label", label, minimum=0, maximum=n_classes - 1)
  fam = members if (members is None or isinstance(members, Family)) else family_from_stacked(
      members, output)

  rn = verify_net(n_net, neighbourhood, label, cfg, bounds=bounds, samples=samples)
  if rn.status != Status.VERIFIED:
    verdict = "NOT_LDCP" if rn.status == Status.FALSIFIED else "NOT_PROVEN"
    return LDCPResult(verdict, label, rn, None, rn.counterexample, time.perf_counter() - t0)

  if fam is not None and samples:
    rng = np.random.default_rng(0)
    xs = np.concatenate([project(neighbourhood, neighbourhood.center)[None],
                         neighbourhood.sample(samples, rng),
                         neighbourhood.sample(samples, rng, corners=True)])
    hit = _family_hit(fam, xs, label)
    if hit is not None:
      rh = VerifyResult(Status.FALSIFIED, "sampling", -np.inf, xs[hit[1]], hit[2],
                        note=f"family member {hit[0]} misclassifies a sampled point")
      return LDCPResult("NOT_LDCP", label, rn, rh, xs[hit[1]], time.perf_counter() - t0)

  rh = verify_net(h_net, neighbourhood, label, cfg, bounds=bounds, samples=0)
  if rh.status == Status.VERIFIED:
    return LDCPResult("LDCP", label, rn, rh, None, time.perf_counter() - t0)
  if rh.status == Status.NOT_VERIFIED and fam is not None:
    hit = _family_hit(fam, rh.counterexample[None], label)
    if hit is not None:
      rh = dataclasses.replace(rh, status=Status.FALSIFIED, counterexample_margin=hit[2],
                               note=f"hyper-network counterexample replayed: member {hit[0]} "
                                    "misclassifies it")
      return LDCPResult("NOT_LDCP", label, rn, rh, rh.counterexample, time.perf_counter() - t0)
  return LDCPResult("NOT_PROVEN", label, rn, rh, None, time.perf_counter() - t0)


def _family_hit(fam: Family, xs: np.ndarray, label: int) -> tuple[int, int, float] | None:
  """First ``(member, point, margin)`` where a family member misclassifies, else None."""
  outs = fam.outputs(xs)
  probe = fam.member(0)
  flat = outs.reshape(-1, outs.shape[-1])
  bad = (net_lib.classify(probe, flat) != label).reshape(outs.shape[:2])
  if not bad.any():
    return None
  k, i = np.argwhere(bad)[0]
  return int(k), int(i), float(net_lib.margins(probe, outs[k, i][None], label)[0])


# ------------------------------------------------------------------------------------------------
# Naive ground truth
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class NaiveResult:
  """Outcome of `verify_naive`.

  Attributes:
    ldcp: True (every member VERIFIED), False (a member misclassifies a point), None (some
      member UNKNOWN and none falsified).
    label: the label checked.
    n_members: family size.
    n_sampling_falsified, n_bounds_verified, n_milp: how members were settled: sampled points,
      bounds (vectorised IBP, then each member's own ``bounds`` method), or a MILP (with
      ``stop_at_first``, members after the first failure are not counted).
    statuses: per member, ``"VERIFIED"``, ``"FALSIFIED"``, ``"UNKNOWN"`` or ``""`` (not checked).
    failing_member, counterexample: the first failure found.
    milp_seconds: total MILP wall-clock (summed over workers).
    seconds: wall-clock time of the whole check.
  """

  ldcp: bool | None
  label: int
  n_members: int
  n_sampling_falsified: int
  n_bounds_verified: int
  n_milp: int
  statuses: list[str]
  failing_member: int | None
  counterexample: np.ndarray | None
  milp_seconds: float
  seconds: float


def verify_naive(model: Any, family: Family | PyTree, neighbourhood: Neighbourhood,
                 label: int, *, cfg: SolveConfig = SolveConfig(), bounds: str = "ibp",
                 output: str | None = None, samples: int = 64, stop_at_first: bool = True,
                 executor: str = "serial", workers: int | None = None,
                 address: str | None = None, chunk: int = 8) -> NaiveResult:
  """Ground-truth LDCP: every member of a trained family verified separately (the naive algorithm,
  Sphynx, §3 and §6).

  Args:
    model: unused for MLP families given as stacked parameters (kept for API symmetry; Conv
      families are not supported here).
    family: stacked parameters (``Ensemble.params``, N included) or a `Family`.
    neighbourhood, label: the query.
    stop_at_first: stop at the first member that is not robust (NaiveLDCP's early exit).
    executor, workers, address: how per-member MILPs run (`boundjax.executor.Executor`, one
      pool for every round; default ``"serial"``: on small networks a member's check takes
      milliseconds, less than a worker process needs to start).
    chunk: MILP jobs per parallel round (between early-exit checks), times the worker count.
  """
  del model
  t0 = time.perf_counter()
  fam = family if isinstance(family, Family) else family_from_stacked(family, output)
  K = fam.size
  statuses = [""] * K
  lo, hi = neighbourhood.lower.reshape(-1), neighbourhood.upper.reshape(-1)
  n_samp = n_bnd = n_milp = 0
  milp_s = 0.0

  def done(ldcp, member=None, cex=None):
    return NaiveResult(ldcp, label, K, n_samp, n_bnd, n_milp, statuses, member, cex, milp_s,
                       time.perf_counter() - t0)

  # 1. sampled points through every member (any failure is a confirmed counterexample)
  rng = np.random.default_rng(0)
  xs = [project(neighbourhood, neighbourhood.center)[None]]
  if samples:
    xs += [neighbourhood.sample(samples, rng), neighbourhood.sample(samples, rng, corners=True)]
  xs = np.concatenate(xs)
  outs = fam.outputs(xs)
  probe = fam.member(0)
  bad = (net_lib.classify(probe, outs.reshape(-1, outs.shape[-1])) != label).reshape(
      outs.shape[:2])
  failing = np.flatnonzero(bad.any(axis=1))
  for k in failing:
    statuses[k] = "FALSIFIED"
  n_samp = int(failing.size)
  first_cex = xs[int(np.argmax(bad[failing[0]]))] if failing.size else None
  if failing.size and stop_at_first:
    return done(False, int(failing[0]), first_cex)

  # 2. member-wise bounds (IBP, or the larger of IBP and CROWN), vectorised over the family
  mlb = fam.margin_lower_bounds(lo, hi, label, method=bounds)
  ok = (mlb > cfg.tol) & ~bad.any(axis=1)
  for k in np.flatnonzero(ok):
    statuses[k] = "VERIFIED"
  n_bnd = int(ok.sum())

  # 3. one MILP per remaining member
  todo = [k for k in range(K) if statuses[k] == ""]
  runner = Executor(executor, workers=workers, address=address)
  n_workers = 1 if runner.kind == "serial" else (workers or 2)
  step = max(1, chunk * n_workers)
  unknown = False
  with runner:
    for s in range(0, len(todo), step):
      block = todo[s:s + step]
      jobs = [VerifyJob(fam.member(k), neighbourhood, label, cfg, bounds, samples=0, tag=k)
              for k in block]
      for k, r in zip(block, runner.map(run_job, jobs)):
        if r.method == "bounds":  # settled by the job's own (e.g. CROWN) bounds
          n_bnd += 1
        else:
          n_milp += 1
          milp_s += r.seconds
        statuses[k] = r.status.value
        if r.status == Status.FALSIFIED and first_cex is None:
          first_cex = r.counterexample
        unknown |= r.status == Status.UNKNOWN
      failed = [k for k in block if statuses[k] == "FALSIFIED"]
      if failed and stop_at_first:
        return done(False, failed[0], first_cex)
  if any(s == "FALSIFIED" for s in statuses):
    return done(False, statuses.index("FALSIFIED"), first_cex)
  return done(None if unknown else True)


# ------------------------------------------------------------------------------------------------
# Sphynx end to end
# ------------------------------------------------------------------------------------------------

def sphynx(model: Any, init_params: PyTree, x: Any, y: Any, full_params: PyTree, *,
           optimizer: Any = None, epochs: int = 10, batch_size: int = 1024, key: Any = 0,
           alpha: float = 0.1, k: int = 400, R: float = 0.1, M: float = 0.9,
           max_networks: int | None = None, progress: bool = True, **train_kwargs):
  """PredHyperNet from a growing sample of leave-one-out networks (Sphynx Alg. 1).

  Training follows Sphynx's settings (§6: 10 epochs, SGD, batch 1024, lr 0.1, L1 1e-5) unless
  ``optimizer``/``epochs``/``batch_size`` say otherwise. Returns
  `boundjax.hypernet.PredHyperNetResult`; pass ``result.hyper`` to `verify` for each
  neighbourhood, and ``family_from_flat(result.networks, full_params)`` as ``members``.
  ``x``, ``y``: the training set D. ``key``: a JAX PRNG key or an int seed (batch order and the
  sampled leave-one-out points; the trainers below take an int).
  """
  from boundjax import ensembles, hypernet
  seed = int(key) if isinstance(key, (int, np.integer)) else int(
      jax.random.randint(key, (), 0, 2**31 - 1))
  opt = optimizer if optimizer is not None else ensembles.sgd(0.1, l1=1e-5)
  train_fn = hypernet.ensemble_trainer(model, init_params, opt, x, y, epochs=epochs,
                                       batch_size=batch_size, seed=seed, progress=False,
                                       **train_kwargs)
  return hypernet.pred_hyper_net(train_fn, full_params, len(x), alpha=alpha, k=k, R=R,
                                 M=M, seed=seed, max_networks=max_networks, progress=progress)
