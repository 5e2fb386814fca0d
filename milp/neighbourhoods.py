"""Input neighbourhoods ``I(x)`` for verification (Sphynx, §2 and §3).

A `Neighbourhood` is a box ``lower <= x' <= upper`` plus optional *discrete groups*: a set of
coordinates that must jointly take one of ``m`` admissible value vectors (e.g. a binary attribute
in {0, 1}, or a categorical attribute's cos/sin pair at its ``m`` encoded points). The MILP
encodes a group with ``m`` binaries summing to 1 (our choice; Sphynx, §2, leaves ``x'_i`` free
over the whole domain).

* `membership(x)`                 — ``{x}`` (label-only membership inference).
* `linf_ball(x, eps)`             — ``{x' : |x' - x|_inf <= eps}`` intersected with ``[0, 1]^d``
                                     (DP-robustness; the clipping is our choice:
                                     it keeps inputs non-negative, as Sphynx, Thm 2, needs).
* `sensitive(x, idx, values=None)` — every coordinate fixed except ``idx``; ``idx`` ranges over
                                     ``values`` (rows of admissible encodings) or, with
                                     ``values=None``, continuously over ``[0, 1]``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class DiscreteGroup:
  """Coordinates ``index`` take one row of ``values`` (shape ``(m, len(index))``)."""

  index: tuple[int, ...]
  values: np.ndarray

  def __post_init__(self):
    v = np.asarray(self.values, np.float64)
    if v.ndim != 2 or v.shape[1] != len(self.index) or v.shape[0] < 1:
      raise ValueError(
          f"DiscreteGroup: values must have shape (m, {len(self.index)}), got {v.shape}.")
    object.__setattr__(self, "values", v)


@dataclasses.dataclass(frozen=True)
class Neighbourhood:
  """A box with optional discrete groups; ``center`` is the input it was built around."""

  center: np.ndarray
  lower: np.ndarray
  upper: np.ndarray
  groups: tuple[DiscreteGroup, ...] = ()
  kind: str = "box"

  def __post_init__(self):
    c = np.asarray(self.center, np.float64)
    lo = np.asarray(self.lower, np.float64)
    hi = np.asarray(self.upper, np.float64)
    if lo.shape != hi.shape or lo.shape != c.shape:
      raise ValueError(
          f"Neighbourhood: center {c.shape}, lower {lo.shape}, upper {hi.shape} must match.")
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
      raise ValueError("Neighbourhood: bounds must be finite.")
    if np.any(lo > hi):
      i = int(np.argmax((lo > hi).reshape(-1)))
      raise ValueError(f"Neighbourhood: lower > upper at flat index {i}.")
    for g in self.groups:
      flat_lo, flat_hi = lo.reshape(-1), hi.reshape(-1)
      idx = np.asarray(g.index)
      if np.any(idx < 0) or np.any(idx >= lo.size):
        raise ValueError(f"Neighbourhood: group index {g.index} out of range for {lo.size} inputs.")
      if np.any(g.values < flat_lo[idx] - 1e-12) or np.any(g.values > flat_hi[idx] + 1e-12):
        raise ValueError("Neighbourhood: a discrete group's values lie outside the box.")
    object.__setattr__(self, "center", c)
    object.__setattr__(self, "lower", lo)
    object.__setattr__(self, "upper", hi)

  @property
  def size(self) -> int:
    return int(self.lower.size)

  def sample(self, n: int, rng: np.random.Generator, corners: bool = False) -> np.ndarray:
    """``n`` points of the neighbourhood (uniform in the box, or box corners), flat ``(n, d)``."""
    lo, hi = self.lower.reshape(-1), self.upper.reshape(-1)
    if corners:
      pts = np.where(rng.random((n, lo.size)) < 0.5, lo, hi)
    else:
      pts = rng.uniform(lo, hi, size=(n, lo.size))
    for g in self.groups:
      rows = g.values[rng.integers(0, len(g.values), size=n)]
      pts[:, list(g.index)] = rows
    return pts

  def contains(self, x: Any, tol: float = 1e-9) -> bool:
    """Membership test for a flat point (box and discrete groups)."""
    x = np.asarray(x, np.float64).reshape(-1)
    lo, hi = self.lower.reshape(-1), self.upper.reshape(-1)
    if np.any(x < lo - tol) or np.any(x > hi + tol):
      return False
    for g in self.groups:
      if not np.any(np.all(np.abs(g.values - x[list(g.index)]) <= tol, axis=1)):
        return False
    return True


def _check_x(x: Any) -> np.ndarray:
  x = np.asarray(x, np.float64)
  if not np.all(np.isfinite(x)):
    raise ValueError("neighbourhood: x has non-finite entries.")
  return x


def membership(x: Any) -> Neighbourhood:
  """The single point ``{x}`` (Sphynx, §3, membership: ``I^inf_0(x)``)."""
  x = _check_x(x)
  return Neighbourhood(x, x.copy(), x.copy(), kind="membership")


def linf_ball(x: Any, radius: float, domain: tuple[float, float] | None = (0.0, 1.0)
              ) -> Neighbourhood:
  """``{x' : |x' - x|_inf <= radius}``, clipped to ``domain`` (DP-robustness, Sphynx, §2)."""
  x = _check_x(x)
  if not np.isfinite(radius) or radius < 0:
    raise ValueError(f"linf_ball: radius must be finite and >= 0, got {radius}.")
  lo, hi = x - radius, x + radius
  if domain is not None:
    lo, hi = np.clip(lo, *domain), np.clip(hi, *domain)
    if np.any(x < domain[0]) or np.any(x > domain[1]):
      raise ValueError(f"linf_ball: x lies outside the domain {domain}.")
  return Neighbourhood(x, lo, hi, kind="linf")


def sensitive(x: Any, idx: int | Sequence[int], values: Any = None,
              domain: tuple[float, float] = (0.0, 1.0)) -> Neighbourhood:
  """Every coordinate fixed except ``idx`` (Sensitivity / individual fairness, Sphynx, §2).

  Args:
    x: the input (flat).
    idx: the coordinate(s) of the sensitive attribute (e.g. the ``sex`` column, or a cos/sin pair).
    values: admissible encodings of the attribute, shape ``(m,)`` for one coordinate or
      ``(m, len(idx))``; ``None`` frees the coordinates continuously over ``domain``.
  """
  x = _check_x(x).reshape(-1)
  index = (int(idx),) if np.ndim(idx) == 0 else tuple(int(i) for i in idx)
  lo, hi = x.copy(), x.copy()
  if values is None:
    lo[list(index)], hi[list(index)] = domain
    return Neighbourhood(x, lo, hi, kind="sensitive")
  v = np.asarray(values, np.float64)
  v = v.reshape(-1, 1) if v.ndim == 1 else v
  if v.shape[1] != len(index):
    raise ValueError(f"sensitive: values must have {len(index)} columns, got shape {v.shape}.")
  lo[list(index)] = v.min(axis=0)
  hi[list(index)] = v.max(axis=0)
  return Neighbourhood(x, lo, hi, (DiscreteGroup(index, v),), kind="sensitive")
