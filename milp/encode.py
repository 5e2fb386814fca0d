"""MILP encodings of ReLU networks and hyper-networks as OR-Tools MathOpt models.

`Encoding` wraps a ``mathopt.Model`` and adds variables and constraint rows in bulk from numpy
arrays (through the model's C++ element store, which is orders of magnitude faster than one
Python call per coefficient). On top of it:

* `Encoding.add_input(nbhd)` — the input vector ``x`` of a `Neighbourhood`: box bounds, and for a
  discrete group ``m`` binaries ``a`` with ``sum a = 1`` and ``x_idx = sum_k a_k v_k``.
* `Encoding.add_network(net, x, lo, hi)` — one network on the given input variables. Several
  networks may share the same ``x`` (Sphynx's N and hyper-network; LUCID's two-copy encoding,
  LUCID, §6.2), and callers may add further rows (e.g. ``z + dl <= z# <= z + du``) and an
  objective over the returned variables.

Network encoding (Tjeng et al. 2019; Sphynx, §5.2):

* pre-activations ``z_m`` are variables bounded by the big-M constants ``[L_m, U_m]`` (IBP or
  CROWN from `milp.bounds`);
* a concrete row is an equality ``z = W h + b``; an interval row is the pair
  ``W_l h + b_l <= z <= W_u h + b_u``, exact when ``h >= 0`` (inputs in [0, 1], post-ReLU).
  When ``h`` may be negative (``l_h < 0``) the pair is widened by
  ``P = (W_u - W_l) max(0, -l_h)`` (Sphynx, §5.2, the form for inputs of either sign):
  ``W_l h + b_l - P <= z <= W_u h + b_u + P``, which is sound (``W h >= W_l h + (W - W_l)
  min(h, 0) >= W_l h - (W_u - W_l) max(0, -l_h)``) but not complete;
* ReLU: stable-active neurons (``L >= 0``) pass ``z`` on (no new variable), stable-inactive
  (``U <= 0``) are dropped from the next layer, and each unstable neuron gets ``y in [0, U]``, a
  binary ``a`` and ``y >= z``, ``y <= z - L (1 - a)``, ``y <= U a``.

All coefficients are float64.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp
from ortools.math_opt.elemental.python import enums
from ortools.math_opt.python import mathopt

from milp import bounds as bounds_lib
from milp.network import AffineLayer, Network
from milp.neighbourhoods import Neighbourhood

_VAR = enums.ElementType.VARIABLE
_CON = enums.ElementType.LINEAR_CONSTRAINT


@dataclasses.dataclass
class NetworkVars:
  """Variable ids of one encoded network.

  Attributes:
    outputs: ids of the output variables (last layer's pre-activations), shape ``(n_out,)``.
    pre: per layer, ids of the pre-activation variables.
    post: per hidden layer, ids of the post-ReLU values (``-1`` where the neuron is dead, i.e.
      the value is the constant 0; the pre-activation id where the neuron is stably active).
    binaries: ids of the ReLU indicator binaries.
    bounds: the big-M constants ``[(L_m, U_m)]`` used.
  """

  outputs: np.ndarray
  pre: list[np.ndarray]
  post: list[np.ndarray]
  binaries: np.ndarray
  bounds: list[tuple[np.ndarray, np.ndarray]]


class Encoding:
  """A MathOpt model built with numpy bulk operations."""

  def __init__(self, name: str = ""):
    self.model = mathopt.Model(name=name)
    self._el = self.model._elemental  # the C++ element store behind the Python API
    self.inputs: np.ndarray | None = None
    self.networks: list[NetworkVars] = []
    self.has_continuous = False

  # -- low level ---------------------------------------------------------------------------------
  def add_variables(self, lower: Any, upper: Any, integer: bool = False) -> np.ndarray:
    """Adds ``len(lower)`` variables with the given bounds; returns their ids."""
    lower = np.atleast_1d(np.asarray(lower, np.float64))
    upper = np.atleast_1d(np.asarray(upper, np.float64))
    if lower.shape != upper.shape or lower.ndim != 1:
      raise ValueError(f"add_variables: bounds of shapes {lower.shape} and {upper.shape}.")
    if np.any(lower > upper):
      raise ValueError("add_variables: a lower bound exceeds its upper bound.")
    ids = self._el.add_elements(_VAR, lower.size)
    if lower.size:
      keys = ids[:, None]
      self._el.set_attrs(enums.DoubleAttr1.VARIABLE_LOWER_BOUND, keys, lower)
      self._el.set_attrs(enums.DoubleAttr1.VARIABLE_UPPER_BOUND, keys, upper)
      if integer:
        self._el.set_attrs(enums.BoolAttr1.VARIABLE_INTEGER, keys, np.ones(lower.size, bool))
      else:
        self.has_continuous = True
    return ids

  def add_binaries(self, n: int) -> np.ndarray:
    return self.add_variables(np.zeros(n), np.ones(n), integer=True)

  def add_rows(self, rows: Any, cols: Any, vals: Any, lower: Any, upper: Any) -> np.ndarray:
    """Adds ``R`` linear constraints ``lower <= A x <= upper`` with ``A`` in COO form.

    ``rows`` index ``0..R-1`` (local to this call), ``cols`` are variable ids; duplicate
    ``(row, col)`` entries are summed.
    """
    lower = np.atleast_1d(np.asarray(lower, np.float64))
    upper = np.atleast_1d(np.asarray(upper, np.float64))
    n = lower.size
    coo = sp.coo_array((np.asarray(vals, np.float64),
                        (np.asarray(rows, np.int64), np.asarray(cols, np.int64))),
                       shape=(n, self._el.get_next_element_id(_VAR)))
    coo.sum_duplicates()
    keep = coo.data != 0
    ids = self._el.add_elements(_CON, n)
    if n:
      self._el.set_attrs(enums.DoubleAttr1.LINEAR_CONSTRAINT_LOWER_BOUND, ids[:, None], lower)
      self._el.set_attrs(enums.DoubleAttr1.LINEAR_CONSTRAINT_UPPER_BOUND, ids[:, None], upper)
    if keep.any():
      keys = np.stack([ids[coo.row[keep]], coo.col[keep].astype(np.int64)], axis=1)
      self._el.set_attrs(enums.DoubleAttr2.LINEAR_CONSTRAINT_COEFFICIENT, keys, coo.data[keep])
    return ids

  def add_dense_rows(self, A: Any, var_ids: np.ndarray, lower: Any, upper: Any) -> np.ndarray:
    """``lower <= A @ x[var_ids] <= upper`` for a dense or sparse ``A`` of shape ``(R, len)``."""
    coo = sp.coo_array(A)
    return self.add_rows(coo.row, np.asarray(var_ids)[coo.col], coo.data, lower, upper)

  def set_objective(self, var_ids: Any, coeffs: Any, offset: float = 0.0,
                    maximize: bool = False) -> None:
    """Sets the linear objective ``offset + sum coeffs * x[var_ids]`` (duplicates summed)."""
    self._el.clear_attr(enums.DoubleAttr1.OBJECTIVE_LINEAR_COEFFICIENT)
    var_ids = np.asarray(var_ids, np.int64)
    coeffs = np.asarray(coeffs, np.float64)
    uniq, inv = np.unique(var_ids, return_inverse=True)
    summed = np.zeros(uniq.size)
    np.add.at(summed, inv, coeffs)
    keep = summed != 0
    if keep.any():
      self._el.set_attrs(enums.DoubleAttr1.OBJECTIVE_LINEAR_COEFFICIENT, uniq[keep][:, None],
                         summed[keep])
    self._el.set_attr(enums.DoubleAttr0.OBJECTIVE_OFFSET, (), float(offset))
    self._el.set_attr(enums.BoolAttr0.MAXIMIZE, (), bool(maximize))

  @property
  def num_variables(self) -> int:
    return self._el.get_num_elements(_VAR)

  @property
  def num_constraints(self) -> int:
    return self._el.get_num_elements(_CON)

  @property
  def num_binaries(self) -> int:
    return int(self._el.get_attr_num_non_defaults(enums.BoolAttr1.VARIABLE_INTEGER))

  # -- inputs ------------------------------------------------------------------------------------
  def add_input(self, nbhd: Neighbourhood) -> np.ndarray:
    """Input variables for ``nbhd`` (box bounds; one-of-m binaries for discrete groups)."""
    lo, hi = nbhd.lower.reshape(-1), nbhd.upper.reshape(-1)
    x = self.add_variables(lo, hi)
    for g in nbhd.groups:
      m, k = g.values.shape
      a = self.add_binaries(m)
      # sum a = 1
      self.add_rows(np.zeros(m), a, np.ones(m), [1.0], [1.0])
      # x_idx - sum_k a_k v_k = 0
      rows = np.concatenate([np.arange(k), np.repeat(np.arange(k), m)])
      cols = np.concatenate([x[list(g.index)], np.tile(a, k)])
      vals = np.concatenate([np.ones(k), -g.values.T.reshape(-1)])
      self.add_rows(rows, cols, vals, np.zeros(k), np.zeros(k))
    if self.inputs is None:
      self.inputs = x
    return x

  # -- networks ----------------------------------------------------------------------------------
  def add_network(self, net: Network, x: np.ndarray, lower: Any, upper: Any,
                  bounds: str | list = "ibp", point_rows_as_equalities: bool = True,
                  relax: Sequence[np.ndarray] | None = None) -> NetworkVars:
    """Encodes ``net`` on the input variables ``x`` whose values lie in ``[lower, upper]``.

    Every unstable ReLU ``y = max(z, 0)`` with ``L < 0 < U`` is exact with a binary ``a``:
    ``y >= z``, ``y <= z - L (1 - a)``, ``y <= U a`` (``y >= 0`` from its bounds), unless
    ``relax`` marks it: then it gets the triangle relaxation ``(U - L) y - U z <= -U L``
    and no binary (relax-if-similar, LUCID, §5.4).

    Args:
      net: concrete network or hyper-network.
      x: input variable ids (shared between networks if called repeatedly).
      lower, upper: the input box (used for the big-M constants and for the widened form).
      bounds: ``"ibp"``, ``"crown"``, or precomputed ``[(L_m, U_m)]``.
      point_rows_as_equalities: encode zero-width rows as one equality (default) instead of the
        inequality pair.
      relax: optional boolean mask per hidden layer: neurons to relax (only unstable ones are).
    """
    lower = np.asarray(lower, np.float64).reshape(-1)
    upper = np.asarray(upper, np.float64).reshape(-1)
    if len(x) != net.input_size:
      raise ValueError(f"add_network: {len(x)} input variables, network takes {net.input_size}.")
    bnds = bounds_lib.compute(net, lower, upper, bounds) if isinstance(bounds, str) else bounds
    if len(bnds) != len(net.layers):
      raise ValueError("add_network: need one (L, U) pair per layer.")
    h_ids = np.asarray(x, np.int64)
    h_lo = lower
    pre_all, post_all, bins = [], [], []
    for m, layer in enumerate(net.layers):
      L, U = (np.asarray(b, np.float64) for b in bnds[m])
      z = self.add_variables(L, np.maximum(U, L))
      pre_all.append(z)
      live = h_ids >= 0
      self._affine_rows(layer, h_ids, live, h_lo, z, point_rows_as_equalities)
      if m == len(net.layers) - 1:
        break
      act, dead = L >= 0, U <= 0
      unst = ~act & ~dead
      post = np.where(act, z, -1)
      rel = unst & np.asarray(relax[m], bool) if relax is not None else np.zeros_like(unst)
      for mask, exact in ((unst & ~rel, True), (rel, False)):
        nu = int(mask.sum())
        if not nu:
          continue
        Lu, Uu, zu = L[mask], U[mask], z[mask]
        y = self.add_variables(np.zeros(nu), Uu)
        r = np.arange(nu)
        # y - z >= 0
        self.add_rows(np.r_[r, r], np.r_[y, zu], np.r_[np.ones(nu), -np.ones(nu)], np.zeros(nu),
                      np.full(nu, np.inf))
        if exact:  # y - z - L a <= -L ; y - U a <= 0
          a = self.add_binaries(nu)
          bins.append(a)
          self.add_rows(np.r_[r, r, r], np.r_[y, zu, a], np.r_[np.ones(nu), -np.ones(nu), -Lu],
                        np.full(nu, -np.inf), -Lu)
          self.add_rows(np.r_[r, r], np.r_[y, a], np.r_[np.ones(nu), -Uu],
                        np.full(nu, -np.inf), np.zeros(nu))
        else:      # triangle: (U - L) y - U z <= -U L
          self.add_rows(np.r_[r, r], np.r_[y, zu], np.r_[Uu - Lu, -Uu], np.full(nu, -np.inf),
                        -Uu * Lu)
        post[mask] = y
      post_all.append(post)
      h_ids = post
      h_lo = np.maximum(L, 0.0)
    nv = NetworkVars(pre_all[-1], pre_all, post_all,
                     np.concatenate(bins) if bins else np.zeros(0, np.int64),
                     [(np.asarray(a), np.asarray(b)) for a, b in bnds])
    self.networks.append(nv)
    return nv

  def _affine_rows(self, layer, h_ids, live, h_lo, z, point_eq: bool) -> None:
    """Rows linking ``z`` to ``h`` for one layer (equalities, interval pairs, widened pairs)."""
    n_out = layer.shape[0]
    wl = sp.csr_array(layer.w_lower)[:, live] if sp.issparse(layer.w_lower) else \
        layer.w_lower[:, live]
    wu = sp.csr_array(layer.w_upper)[:, live] if sp.issparse(layer.w_upper) else \
        layer.w_upper[:, live]
    cols = h_ids[live]
    neg_lo = np.maximum(-h_lo[live], 0.0)
    pen = np.asarray((wu - wl) @ neg_lo, np.float64).reshape(-1) if np.any(neg_lo > 0) else \
        np.zeros(n_out)
    diff = wu - wl
    row_width = np.asarray(abs(diff).sum(axis=1)).reshape(-1) + (layer.b_upper - layer.b_lower)
    point_rows = (row_width == 0) if point_eq else np.zeros(n_out, bool)
    eye = sp.identity(n_out, format="csr")

    def rows_for(mask, w, lo, hi):
      idx = np.flatnonzero(mask)
      if idx.size == 0:
        return
      A = sp.hstack([eye[idx], -sp.csr_array(w)[idx]], format="coo")
      all_cols = np.concatenate([z, cols])
      self.add_rows(A.row, all_cols[A.col], A.data, lo[idx], hi[idx])

    inf = np.full(n_out, np.inf)
    # z - W h = b  (concrete rows)
    rows_for(point_rows, wl, layer.b_lower, layer.b_lower)
    iv = ~point_rows
    # z - W_l h >= b_l - P ;  z - W_u h <= b_u + P
    rows_for(iv, wl, layer.b_lower - pen, inf)
    rows_for(iv, wu, -inf, layer.b_upper + pen)

  # -- objectives --------------------------------------------------------------------------------
  def margin_terms(self, net: Network, nv: NetworkVars, label: int,
                   other: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, coeffs)`` of the margin ``z_label - z_other`` (logits) or ``±N(x)`` (sign)."""
    if net.output == "sign":
      if label not in (0, 1):
        raise ValueError(f"margin: label must be 0 or 1 for a sign network, got {label}.")
      return nv.outputs[:1], np.array([1.0 if label == 1 else -1.0])
    if not 0 <= label < net.num_outputs:
      raise ValueError(f"margin: label {label} out of range for {net.num_outputs} classes.")
    if other is None or other == label or not 0 <= other < net.num_outputs:
      raise ValueError(f"margin: need another class index, got {other}.")
    return nv.outputs[[label, other]], np.array([1.0, -1.0])

  def values(self, result: Any, ids: np.ndarray) -> np.ndarray:
    """Values of variables ``ids`` in a solve result's best primal solution."""
    sol = result.solutions[0].primal_solution if result.solutions else None
    if sol is None:
      raise ValueError("values: the result has no primal solution.")
    lookup = {v.id: val for v, val in sol.variable_values.items()}
    return np.array([lookup.get(int(i), 0.0) if i >= 0 else 0.0 for i in ids])


def reconstruct_member(net: Network, x: np.ndarray, pre: Sequence[np.ndarray],
                       post_inputs: Sequence[np.ndarray]) -> Network:
  """A concrete network inside ``net`` reproducing an interval-MILP trace (the tight choice in the
  proof of Sphynx, Thm 2, App. B).

  For each neuron ``t = (z - (W_l h + b_l)) / ((W_u - W_l) h + (b_u - b_l))`` clipped to
  ``[0, 1]`` (0 when the denominator is 0); the member has ``W = W_l + t (W_u - W_l)``,
  ``b = b_l + t (b_u - b_l)``. Exact when every ``h >= 0``.
  """
  layers = []
  for layer, z, h in zip(net.layers, pre, post_inputs):
    wl = layer.w_lower.toarray() if sp.issparse(layer.w_lower) else layer.w_lower
    wu = layer.w_upper.toarray() if sp.issparse(layer.w_upper) else layer.w_upper
    base = wl @ h + layer.b_lower
    den = (wu - wl) @ h + (layer.b_upper - layer.b_lower)
    t = np.where(den > 0, (z - base) / np.where(den > 0, den, 1.0), 0.0)
    t = np.clip(t, 0.0, 1.0)
    layers.append(AffineLayer.point(wl + t[:, None] * (wu - wl),
                                    layer.b_lower + t * (layer.b_upper - layer.b_lower)))
  return dataclasses.replace(net, layers=tuple(layers))
