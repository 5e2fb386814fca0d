"""Screening: a sound iDP-DB (LUCID, §4, Def. 4.1) of each member from its difference intervals
alone, no MILP.

Ours, not LUCID's. `screen_bound` bounds one node by its logit difference intervals against N;
`member_bounds` applies it to every member alone (one interval pass each). The maximum over the
members is already a sound iDP-DB of the family; `milp.idpdb.search.lucid_compute` with
``IdpDbConfig(screen=True)`` then peels the members of largest bound off as singleton MILPs.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from milp.difference import DifferenceBounds, difference_bounds
from milp.idpdb.config import IdpDbConfig
from milp.idpdb.family import as_family, check_compatible, check_label, confidence_cap
from milp.idpdb.tighten import tighten_net
from milp.ldcp import Family
from milp.network import Network


def screen_bound(net: Network, diff: DifferenceBounds, label: int) -> float:
  """A sound iDP-DB of one node from its logit difference intervals alone (no MILP).

  If N# does not predict ``c`` at ``x`` then some ``c' != c`` has ``z#_c' >= z#_c``, so with
  ``Delta = z# - z`` (`milp.difference`, logits ``[dl, du]``)

      C^c_N(x) <= z_c - z_c' <= (z_c - z_c') - (z#_c - z#_c') = Delta_c' - Delta_c <= du_c' - dl_c,

  hence ``beta*_c <= max_{c' != c} (du_c' - dl_c)``, capped by N's largest confidence. Sign
  networks: ``C^1 = z <= z - z# <= -dl`` and ``C^0 = -z <= du``. Tight when N# is one member close
  to N, loose for a wide hyper-network (there the MILP's joint encoding matters).
  """
  dl, du = diff.pre[-1]
  if net.output == "sign":
    b = float(-dl[0] if label == 1 else du[0])
  else:
    others = [k for k in range(net.num_outputs) if k != label]
    b = float(np.max(du[others] - dl[label]))
  return min(b, confidence_cap(net, diff.ref[-1], label))


def member_bounds(net: Network, members: Sequence[Network] | Family, label: int,
                  cfg: IdpDbConfig = IdpDbConfig(), *, input_lower: Any = 0.0,
                  input_upper: Any = 1.0, ref_bounds: list | None = None,
                  progress: bool = False) -> np.ndarray:
  """``u_i >= beta*_c({N_-i})`` for every member: `screen_bound` on each member alone.

  One difference-interval pass per member (about 0.6 ms for Adult 2x50 in float64), so a whole
  leave-one-out family of 32k networks is screened in seconds, where one MILP over the
  hyper-network of all of them is far looser (the box over 32k members loses which parameters
  move together). ``max_i u_i`` is a sound iDP-DB of the family.

  Args:
    net: N (concrete).
    members: the leave-one-out networks (as `lucid_compute` takes them).
    label: the class c.
    cfg: ``cfg.bounds`` and ``cfg.tighten`` choose N's bounds when ``ref_bounds`` is ``None``.
    input_lower, input_upper: the input box.
    ref_bounds: precomputed sound pre-activation bounds of N (shared by every member).
    progress: tqdm bar over members.

  Returns:
    ``(K,)`` float64 bounds, in member order.
  """
  family = as_family(members, net.output)
  check_compatible(net, family.member(0), "the family")
  label = check_label(net, label)
  d = net.input_size
  lo = np.broadcast_to(np.asarray(input_lower, np.float64), (d,)).copy()
  hi = np.broadcast_to(np.asarray(input_upper, np.float64), (d,)).copy()
  if ref_bounds is None:
    ref_bounds = tighten_net(net, lo, hi, cfg)
  rows = range(family.size)
  if progress:
    from tqdm.auto import tqdm
    rows = tqdm(rows, desc=f"screen members, class {label}", unit="net", mininterval=2.0)
  out = np.empty(family.size)
  for i in rows:
    diff = difference_bounds(net, family.member(i), lo, hi, cfg.bounds, ref_bounds=ref_bounds)
    out[i] = screen_bound(net, diff, label)
  return out
