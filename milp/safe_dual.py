"""Safe bounds of a linear program from any dual vector (Neumaier and Shcherbina 2004, "Safe
bounds in linear and mixed-integer linear programming", Math. Program. 99, §2).

An LP solver's optimum is a float computed with feasibility tolerances (HiGHS: 1e-7), so it
may overshoot the true optimum. Its dual vector, however, gives a bound by weak duality that is
valid whatever the vector's accuracy, once evaluated with rounding accounted for. For

    min  c·x + c0   over   l <= A x <= u,   lo <= x <= hi                         (P)

and any ``y``, every feasible ``x`` satisfies ``c·x = y·(A x) + r·x`` with ``r = c - Aᵀ y``, so

    c·x + c0 >= Σ_r y_r · (l_r if y_r > 0 else u_r)  +  Σ_j min_{x_j in [lo_j, hi_j]} r_j x_j + c0.

A row whose needed side is infinite gets ``y_r = 0``; a variable whose needed bound is infinite
makes the bound ``-inf`` (sound, and never the case for the encodings of this package, whose
variables all lie in boxes). Integrality is ignored, so the bound also holds for a MILP, as the
bound of its LP relaxation. Rounding: ``r`` is enclosed in ``[r - e, r + e]`` with the a-priori
error bound ``e = γ_{2k+2} (|c| + |A|ᵀ|y|) + (2k+2)·λ`` of a ``k``-term sum of products
(Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1; λ the smallest normal number),
and the final sum of ``N`` products is moved down by ``γ_{2N+2}·Σ|terms| + (2N+2)·λ``.
A maximisation is the minimisation of ``-c``.

* `LinearProgram.from_proto(model_proto)` — the constraint data of a MathOpt model.
* `LinearProgram.bound(obj_idx, obj_coef, offset, dual_ids, dual_values, maximize)` — the safe
  bound (a lower bound when minimising, an upper bound when maximising).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import scipy.sparse as sp

from boundjax.core import rounding

_TINY = rounding.underflow_threshold(np.float64)


def _gamma(n: int) -> float:
  """γ_n in float64 (`boundjax.core.rounding.gamma`)."""
  return rounding.gamma(n, np.float64)


def _ids(field: Any) -> np.ndarray:
  return np.asarray(list(field), np.int64)


def _vals(field: Any) -> np.ndarray:
  return np.asarray(list(field), np.float64)


@dataclasses.dataclass(frozen=True)
class LinearProgram:
  """The constraints of (P): ``A`` (CSC, rows = constraints), row sides ``l, u``, variable box
  ``lo, hi``, and the model's variable and constraint ids (ascending, as MathOpt exports them)."""

  A: sp.csc_matrix
  l: np.ndarray
  u: np.ndarray
  lo: np.ndarray
  hi: np.ndarray
  var_ids: np.ndarray
  con_ids: np.ndarray

  @classmethod
  def from_proto(cls, proto: Any) -> "LinearProgram":
    """From a ``ModelProto`` (``mathopt.Model.export_model()``)."""
    var_ids = _ids(proto.variables.ids)
    con_ids = _ids(proto.linear_constraints.ids)
    mat = proto.linear_constraint_matrix
    rows = np.searchsorted(con_ids, _ids(mat.row_ids))
    cols = np.searchsorted(var_ids, _ids(mat.column_ids))
    A = sp.csc_matrix((_vals(mat.coefficients), (rows, cols)), shape=(con_ids.size, var_ids.size))
    return cls(A, _vals(proto.linear_constraints.lower_bounds),
               _vals(proto.linear_constraints.upper_bounds),
               _vals(proto.variables.lower_bounds), _vals(proto.variables.upper_bounds),
               var_ids, con_ids)

  def bound(self, obj_ids: Any, obj_coef: Any, offset: float, dual_ids: Any, dual_values: Any,
            maximize: bool) -> float:
    """A bound of ``offset + Σ obj_coef · x[obj_ids]`` over (P) from the dual values
    ``dual_values`` of the constraints ``dual_ids`` (MathOpt's convention: for a minimisation
    ``y_r > 0`` on a row at its lower side; any vector gives a valid bound, a good one a tight
    bound). Returns a float that is ``<=`` every feasible objective value when minimising and
    ``>=`` it when maximising; ``∓inf`` when nothing finite follows."""
    sign = -1.0 if maximize else 1.0
    c = np.zeros(self.var_ids.size)
    np.add.at(c, np.searchsorted(self.var_ids, np.asarray(obj_ids, np.int64)),
              sign * np.asarray(obj_coef, np.float64))
    y = np.zeros(self.con_ids.size)
    y[np.searchsorted(self.con_ids, np.asarray(dual_ids, np.int64))] = (
        sign * np.asarray(dual_values, np.float64))
    y = np.where(np.isfinite(y), y, 0.0)
    y = np.where(((y > 0) & ~np.isfinite(self.l)) | ((y < 0) & ~np.isfinite(self.u)), 0.0, y)
    lower = _safe_min(self.A, self.l, self.u, self.lo, self.hi, c, sign * float(offset), y)
    return -lower if maximize else lower


def _safe_min(A: sp.csc_matrix, l, u, lo, hi, c, c0: float, y) -> float:
  """The rigorous lower bound of module docstring for ``min c·x + c0`` and the dual ``y``."""
  k = int(np.max(np.diff(A.indptr), initial=0)) + 1
  r = c - A.T @ y
  e = _gamma(2 * k + 2) * (np.abs(c) + abs(A).T @ np.abs(y)) + (2 * k + 2) * _TINY
  r_lo = np.nextafter(r - e, -np.inf)
  r_hi = np.nextafter(r + e, np.inf)
  with np.errstate(invalid="ignore", over="ignore"):
    corners = np.stack([r_lo * lo, r_lo * hi, r_hi * lo, r_hi * hi])
  corners = np.where(np.isnan(corners), 0.0, corners)  # 0 * inf: that corner's r is 0
  var_terms = corners.min(axis=0)
  row_terms = np.where(y > 0, y * np.where(y > 0, l, 0.0), 0.0) + np.where(
      y < 0, y * np.where(y < 0, u, 0.0), 0.0)
  terms = np.concatenate([var_terms, row_terms, [c0]])
  if np.any(terms == -np.inf) or not np.all(np.isfinite(terms)):
    return -math.inf
  n = terms.size
  total = float(np.sum(terms))
  slack = _gamma(2 * n + 2) * float(np.sum(np.abs(terms))) + (2 * n + 2) * _TINY
  return float(np.nextafter(np.nextafter(total - slack, -np.inf), -np.inf))
