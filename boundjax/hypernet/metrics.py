"""Sphynx's ablation metrics of a hyper-network against a family of networks (Sphynx, §5)."""

from __future__ import annotations

import dataclasses

from typing import Any

import jax
import numpy as np

from boundjax.hypernet.tree import flat_bounds, flatten_stacked

PyTree = Any


# ---------------------------------------------------------------------------------------------
# Sphynx ablation metrics (Sphynx, Tables 3 and 4)
# ---------------------------------------------------------------------------------------------

def _bounds(hyper: Any) -> tuple[np.ndarray, np.ndarray]:
  if (isinstance(hyper, tuple) and len(hyper) == 2
      and all(isinstance(h, (np.ndarray, jax.Array)) and np.ndim(h) == 1 for h in hyper)):
    return np.asarray(hyper[0], np.float64), np.asarray(hyper[1], np.float64)
  lo, hi = flat_bounds(hyper)
  return lo.astype(np.float64), hi.astype(np.float64)


def _networks(all_nets: Any) -> np.ndarray:
  if isinstance(all_nets, np.ndarray) and all_nets.ndim == 2:
    return all_nets.astype(np.float64)
  return flatten_stacked(all_nets).astype(np.float64)


def weight_abstraction_rate(hyper: Any, all_nets: Any) -> float:
  """Percentage of parameters whose interval contains the parameter's value in every network."""
  lo, hi = _bounds(hyper)
  w = _networks(all_nets)
  return 100.0 * float(np.mean((lo <= w.min(0)) & (hi >= w.max(0))))


def miscoverage(hyper: Any, all_nets: Any) -> tuple[float, int]:
  """Mean over parameters of ``|I* \\ I_pred| / |I_pred|`` (``I*`` = [min, max] over networks).

  Returns ``(mean, excluded)``: parameters with a zero-width predicted interval are left out of
  the mean (the ratio is 0/0 or x/0 there) and counted in ``excluded``.
  """
  lo, hi = _bounds(hyper)
  w = _networks(all_nets)
  slo, shi = w.min(0), w.max(0)
  inter = np.maximum(0.0, np.minimum(hi, shi) - np.maximum(lo, slo))
  missed = (shi - slo) - inter
  width = hi - lo
  ok = width > 0
  return float(np.mean(missed[ok] / width[ok])) if ok.any() else float("nan"), int((~ok).sum())


def overcoverage(hyper: Any, all_nets: Any) -> tuple[float, int]:
  """Geometric mean over parameters of ``|I_pred ⊔ I*| / |I*|``.

  Returns ``(geometric mean, excluded)``: parameters with ``|I*| = 0`` (equal in every network)
  are left out and counted.
  """
  lo, hi = _bounds(hyper)
  w = _networks(all_nets)
  slo, shi = w.min(0), w.max(0)
  star = shi - slo
  ok = star > 0
  ratio = (np.maximum(hi, shi) - np.minimum(lo, slo))[ok] / star[ok]
  return (float(np.exp(np.mean(np.log(ratio)))) if ok.any() else float("nan"),
          int((~ok).sum()))


def network_abstraction_rate(hyper: Any, all_nets: Any) -> float:
  """Percentage of the networks (rows) that lie entirely inside the hyper-network."""
  lo, hi = _bounds(hyper)
  w = _networks(all_nets)
  return 100.0 * float(np.mean(np.all((w >= lo) & (w <= hi), axis=1)))


@dataclasses.dataclass(frozen=True)
class SphynxMetrics:
  """Sphynx's four ablation metrics of a hyper-network against a family (Tables 3 and 4).

  Attributes:
    weight_abstraction_rate: % of parameters whose interval contains every network's value.
    miscoverage: mean ``|I* \\ I_pred| / |I_pred|`` (a fraction), over the parameters with a
      non-zero predicted width; ``miscoverage_excluded`` counts the others.
    overcoverage: geometric mean of ``|I_pred ⊔ I*| / |I*|`` over the parameters with
      ``|I*| > 0``; ``overcoverage_excluded`` counts the others.
    network_abstraction_rate: % of the networks lying entirely inside the hyper-network.
  """

  weight_abstraction_rate: float
  miscoverage: float
  miscoverage_excluded: int
  overcoverage: float
  overcoverage_excluded: int
  network_abstraction_rate: float

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)


def sphynx_metrics(hyper: Any, all_nets: Any) -> SphynxMetrics:
  """All four Sphynx metrics (Sphynx, Tables 3 and 4) of ``hyper`` against the networks ``all_nets``.

  ``hyper`` is a hyper-network pytree or ``(lower, upper)`` vectors; ``all_nets`` is stacked
  parameters or an ``(M, P)`` matrix. Miscoverage is a fraction here (Table 3 prints it, by our
  reading, in percent).
  """
  mis, mis_ex = miscoverage(hyper, all_nets)
  over, over_ex = overcoverage(hyper, all_nets)
  return SphynxMetrics(weight_abstraction_rate=weight_abstraction_rate(hyper, all_nets),
                       miscoverage=mis, miscoverage_excluded=mis_ex,
                       overcoverage=over, overcoverage_excluded=over_ex,
                       network_abstraction_rate=network_abstraction_rate(hyper, all_nets))


