"""PredHyperNet (Sphynx, Alg. 1): a hyper-network predicted from rounds of leave-one-out training."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import numpy as np

from boundjax import ensembles
from boundjax.hypernet.predint import pred_int
from boundjax.hypernet.tree import flatten_params, flatten_stacked, from_flat_bounds, jaccard

PyTree = Any


# ---------------------------------------------------------------------------------------------
# PredHyperNet (Sphynx Alg. 1)
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class PredHyperNetResult:
  """Output of `pred_hyper_net`.

  Attributes:
    hyper: the predicted hyper-network (pytree of Intervals, outward-rounded).
    networks: ``(K, P)`` float matrix of the networks used (row 0 = N).
    entries: ``(K - 1,)`` indices removed by rows 1..K-1, in sampling order (never repeated).
    iterations: rounds of ``k`` networks trained.
    converged_fraction: per round, the fraction of parameters with ``1 - J <= R``.
    converged: whether the stopping rule fired (False when stopped by ``max_networks`` or
      because every point of D was used).
    alpha_p: the per-parameter error ``α / P`` given to `pred_int`.
  """

  hyper: PyTree
  networks: np.ndarray
  entries: np.ndarray
  iterations: int
  converged_fraction: list
  converged: bool
  alpha_p: float


def pred_hyper_net(train_fn: Callable[[np.ndarray], PyTree], full_params: PyTree, n: int, *,
                   alpha: float = 0.1, k: int = 400, R: float = 0.1, M: float = 0.9,
                   seed: int = 0, max_networks: Optional[int] = None, variant: str = "predint",
                   progress: bool = True) -> PredHyperNetResult:
  """Sphynx PredHyperNet (Sphynx, Alg. 1, with its Jaccard stopping condition).

  Start from ``nets = {N}`` and the point abstraction of N; each round samples ``k`` new points
  uniformly without replacement from ``D \\ entr``, trains ``T(D \\ {x})`` for each
  (``train_fn(indices) -> stacked params``, one network per index), and predicts every parameter's
  interval with ``pred_int(V_w, α / P)`` over all ``K`` networks so far. Stops when at least
  ``M · P`` parameters have Jaccard distance ``1 - J(H_curr, H_prev) <= R``. At least two rounds
  always run (the first compares with the point abstraction).

  Args:
    train_fn: trains the leave-one-out networks of a batch of indices (see `ensemble_trainer`).
    full_params: N, the network trained on all of D.
    n: ``|D|``.
    alpha, k, R, M: Sphynx's defaults 0.1, 400, 0.1, 0.9 (Sphynx's experiments).
    seed: seed of the sampling of entries.
    max_networks: stop (unconverged) once K would exceed this.
    variant: `pred_int` variant.
  """
  if not 0 < alpha < 1 or not 0 <= R <= 1 or not 0 < M <= 1 or k <= 0:
    raise ValueError(f"pred_hyper_net: need 0<alpha<1, 0<=R<=1, 0<M<=1, k>0; got "
                     f"alpha={alpha}, R={R}, M={M}, k={k}.")
  rng = np.random.default_rng(seed)
  order = rng.permutation(n)
  w_full = flatten_params(full_params)
  n_params = w_full.size
  alpha_p = alpha / n_params
  nets = [w_full[None, :]]
  entries: list[np.ndarray] = []
  curr, prev = (w_full, w_full), None
  fractions, used, iterations, converged = [], 0, 0, False
  bar = None
  if progress:
    from tqdm.auto import tqdm
    bar = tqdm(desc="PredHyperNet rounds", unit="round")
  while True:
    frac = float(np.mean(1.0 - jaccard(curr, prev) <= R))
    if prev is not None:
      fractions.append(frac)
    if frac >= M:
      converged = True
      break
    take = min(k, n - used)
    if max_networks is not None:
      take = min(take, max_networks - 1 - used)
    if take <= 0:
      break
    idx = order[used:used + take]
    used += take
    stacked = train_fn(idx)
    block = flatten_stacked(stacked)
    if block.shape != (take, n_params):
      raise ValueError(f"train_fn returned {block.shape} parameters for {take} indices; "
                       f"expected ({take}, {n_params}).")
    nets.append(block)
    entries.append(idx)
    prev, curr = curr, pred_int(np.concatenate(nets), alpha_p, variant)
    iterations += 1
    if bar is not None:
      bar.update(1)
      bar.set_postfix(K=used + 1, converged=f"{np.mean(1.0 - jaccard(curr, prev) <= R):.3f}")
  if bar is not None:
    bar.close()
  hyper = from_flat_bounds(np.asarray(curr[0]), np.asarray(curr[1]), full_params)
  return PredHyperNetResult(hyper, np.concatenate(nets),
                            np.concatenate(entries) if entries else np.zeros(0, np.int64),
                            iterations, fractions, converged, alpha_p)


def ensemble_trainer(model: Any, init_params: PyTree, optimizer: Any, x: Any, y: Any,
                     **train_kwargs) -> Callable[[np.ndarray], PyTree]:
  """``train_fn`` for `pred_hyper_net`: leave-one-out networks by `ensembles.train_ensemble`."""

  def train_fn(indices: np.ndarray) -> PyTree:
    removed = ensembles.leave_k_out(np.asarray(indices), include_full=False)
    return ensembles.train_ensemble(model, init_params, optimizer, x, y, removed,
                                    **train_kwargs).params

  return train_fn


