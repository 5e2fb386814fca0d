"""Families of leave-one-out networks, their hyper-networks, and class confidences.

* `as_family` — a `milp.ldcp.Family` (stacked float64 weights) from concrete networks or
  stacked Flax parameters: an MLP's directly, any other model `from_flax` encodes (e.g. LUCID's
  `boundjax.models.Conv1dNet`) through `milp.network.from_flax` with its ``model``.
* `hyper_of` — the hyper-network N# of some members: coordinate-wise ``[min, max]`` of their
  parameters (LUCID, §5.2, Def. 5.1).
* `flat_rows` — the members' flattened parameters, the k-means features (LUCID, §6.1).
* `confidence` — ``C^c_N(x) = z_c - max_{c' != c} z_c'`` (sign networks: ``±z``), and
  `confidence_cap`, the largest value N's sound logit bounds allow.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from milp import network as net_lib
from milp.ldcp import Family, family_from_stacked
from milp.network import AffineLayer, Network


def as_family(members: Sequence[Network] | Family | Any, output: str | None = None, *,
              model: Any = None, input_shape: Sequence[int] | None = None) -> Family:
  """A `milp.ldcp.Family` from concrete `Network`s, a `Family`, or stacked Flax params.

  Stacked params (every leaf with a leading member axis) of an MLP need no ``model``. Those of
  another chain of ``nn.Dense``/``nn.Conv`` layers with ReLU between (LUCID's CNN,
  `boundjax.models.Conv1dNet`) need ``model`` and ``input_shape`` (one input, no batch axis):
  each member becomes the dense matrices of its layers (`member_networks`). A convolution's
  matrix repeats each kernel weight once per output position and is 0 elsewhere, so the
  hyper-network's per-entry ``[min, max]`` bounds each output position by the same kernel
  intervals that LUCID's per-position encoding of a hyper-convolution uses (LUCID, §5.2).
  """
  if isinstance(members, Family):
    return members
  if isinstance(members, dict) and model is not None and not is_mlp(model):
    members = member_networks(model, members, input_shape, output)
  elif isinstance(members, dict):
    return family_from_stacked(members, output)
  members = list(members)
  if not members:
    raise ValueError("idpdb: the family has no members.")
  first = members[0]
  for i, m in enumerate(members):
    if not isinstance(m, Network) or not m.is_point:
      raise ValueError(f"idpdb: member {i} is not a concrete milp.network.Network.")
    if [l.shape for l in m.layers] != [l.shape for l in first.layers]:
      raise ValueError(f"idpdb: member {i} has layer shapes {[l.shape for l in m.layers]}, "
                       f"member 0 has {[l.shape for l in first.layers]}.")
  dense = lambda a: a.toarray() if sp.issparse(a) else np.asarray(a, np.float64)
  ws = [np.stack([dense(m.layers[k].w_lower) for m in members]) for k in range(len(first.layers))]
  bs = [np.stack([m.layers[k].b_lower for m in members]) for k in range(len(first.layers))]
  return Family(ws, bs, first.output)


def is_mlp(model: Any) -> bool:
  """Whether ``model`` is a `boundjax.models.MLP` (its params are read without the model)."""
  from boundjax.models import MLP
  return isinstance(model, MLP)


def member_networks(model: Any, stacked: Any, input_shape: Sequence[int] | None,
                    output: str | None = None) -> list[Network]:
  """Concrete dense `Network`s of every member of stacked Flax params of a Dense/Conv chain.

  Each is `milp.network.from_flax` (every layer's matrix read off the model's program exactly,
  and the chain replayed against ``model.apply``), stored dense so members stack.
  """
  import jax

  if input_shape is None:
    raise ValueError("idpdb: input_shape is required with a Flax model that is not an MLP.")
  leaves = jax.tree_util.tree_leaves(stacked)
  if not leaves:
    raise ValueError("idpdb: the family has no members.")
  host = jax.tree_util.tree_map(np.asarray, stacked)
  n = int(np.shape(leaves[0])[0])
  return [net_lib.from_flax(model, jax.tree_util.tree_map(lambda a: a[i], host), input_shape,
                            output, sparse_threshold=0.0) for i in range(n)]


def hyper_of(family: Family, rows: Any) -> Network:
  """The hyper-network over ``rows`` of the family: coordinate-wise [min, max] (LUCID, Def. 5.1)."""
  rows = np.asarray(rows)
  if rows.size == 0:
    raise ValueError("hyper_of: no member rows.")
  layers = tuple(AffineLayer(w[rows].min(0), w[rows].max(0), b[rows].min(0), b[rows].max(0))
                 for w, b in zip(family.ws, family.bs))
  return Network(layers, (family.ws[0].shape[2],), family.output)


def flat_rows(family: Family) -> np.ndarray:
  """``(K, P)`` flattened parameters of every member (the k-means features, LUCID, §6.1)."""
  parts = [w.reshape(family.size, -1) for w in family.ws] + [b for b in family.bs]
  return np.concatenate(parts, axis=1)


def check_compatible(net: Network, other: Network, what: str) -> None:
  """Raises ``ValueError`` unless N is concrete and ``other`` has N's layer shapes and output
  rule."""
  if not net.is_point:
    raise ValueError("idpdb: N must be a concrete network (point parameters).")
  if len(net.layers) != len(other.layers) or any(
      a.shape != b.shape for a, b in zip(net.layers, other.layers)):
    raise ValueError(f"idpdb: {what} has layer shapes {[l.shape for l in other.layers]} but N has "
                     f"{[l.shape for l in net.layers]} (mismatched architectures).")
  if net.output != other.output:
    raise ValueError(f"idpdb: N's output rule is {net.output!r} but {what}'s is {other.output!r}.")


def check_label(net: Network, label: int) -> int:
  """``label`` as an int; raises ``ValueError`` when it is not a class of N."""
  if not isinstance(label, (int, np.integer)) or not 0 <= int(label) < net.num_classes:
    raise ValueError(f"idpdb: label {label!r} out of range for {net.num_classes} classes.")
  return int(label)


def confidence(net: Network, outputs: np.ndarray, label: int) -> np.ndarray:
  """``C^c_N`` from outputs ``(n, out)``: ``z_c - max_{c' != c} z_c'``; sign nets: ``±z``."""
  return net_lib.margins(net, outputs, label)


def confidence_cap(net: Network, out_bounds: tuple[np.ndarray, np.ndarray], label: int) -> float:
  """The largest ``C^c_N(x)`` N's sound logit bounds allow: ``u_c - max_{c'} l_c'`` (sign:
  ``±z``)."""
  L_out, U_out = out_bounds
  if net.output == "sign":
    return float(U_out[0] if label == 1 else -L_out[0])
  others = [k for k in range(net.num_outputs) if k != label]
  return float(np.min(U_out[label] - L_out[others]))
