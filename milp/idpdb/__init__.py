"""LUCID's iDP deterministic bound (iDP-DB): a MILP over N and a hyper-network, and the
branch-and-bound over hyper-networks that tightens it (LUCID, §4–§6).

For a class ``c`` the per-class iDP-DB is (LUCID, §4, Eq. 1)

    beta*_c = max { C^c_N(x) : x in [0, 1]^d, some leave-one-out network N_-i has C^c_{N_-i}(x) <= 0 },

with the confidence ``C^c_N(x) = z_c - max_{c' != c} z_c'``. For a one-output *sign* network
(`milp.network`'s convention: class 1 iff ``N(x) >= 0``) ``C^1 = z`` and ``C^0 = -z``; "N# does
not predict c" is relaxed to ``C^c_{N#} <= 0`` (ties included), a superset of the real
disagreement set, so every bound stays sound.

Modules, in dependency order:

=====================  ==========================================================================
`config`               `IdpDbConfig` (validated at construction) and the result dataclasses
`family`               families of members, hyper-networks ``[min, max]`` of members, confidences
`rows`                 the rows of the node MILP (Eq. 3) on a `milp.encode.Encoding`
`tighten`              LP/MILP tightening of N and N# (LUCID, §6.2): `tighten_net`, `tighten_hyper`
`screening`            difference-interval bound of one node / every member, no MILP
                       (`screen_bound`, `member_bounds`; ours, not LUCID's)
`node`                 `node_bound`: one node MILP (dual bound, replayed incumbent); `NodeJob`
`branching`            k-means children with the elbow rule (LUCID, §6.1): `partition`, `elbow_k`
`search`               `lucid_compute` (Alg. 1) and `betas` (every class, from Flax parameters)
`members`              `naive_compute` (one MILP per member, LUCID, §5.1) and `per_member_betas`
`guard`                `compute_betas`: β per class for `boundjax.privacy.LabelOnlyGuard`
`attack`               `attack`: real leaking inputs by gradient search (a lower bound)
=====================  ==========================================================================

Node MILPs run on `boundjax.executor` (``IdpDbConfig(workers=..., executor="process" | "ray",
address=...)``): the children of a popped node are solved together.
"""

from milp.idpdb.attack import attack
from milp.idpdb.branching import elbow_k, partition
from milp.idpdb.config import (TIGHTEN_MODES, AttackResult, BetaResult, IdpDbConfig, IdpDbResult,
                               MemberBetas, NaiveBetaResult, NodeRecord, NodeResult, json_float)
from milp.idpdb.family import as_family, confidence, confidence_cap, flat_rows, hyper_of
from milp.idpdb.guard import BETA_METHODS, compute_betas
from milp.idpdb.members import naive_compute, per_member_betas
from milp.idpdb.node import NodeJob, node_bound, run_node
from milp.idpdb.screening import member_bounds, screen_bound
from milp.idpdb.search import betas, lucid_compute
from milp.idpdb.tighten import tighten_hyper, tighten_net

__all__ = [
    "attack", "elbow_k", "partition", "TIGHTEN_MODES", "AttackResult", "BetaResult",
    "IdpDbConfig", "IdpDbResult", "MemberBetas", "NaiveBetaResult", "NodeRecord", "NodeResult",
    "json_float", "as_family", "confidence", "confidence_cap", "flat_rows", "hyper_of",
    "BETA_METHODS", "compute_betas", "naive_compute", "per_member_betas", "NodeJob", "node_bound",
    "run_node", "member_bounds", "screen_bound", "betas", "lucid_compute", "tighten_hyper",
    "tighten_net",
]
