"""MILP layer of boundjax: exact verification of ReLU networks and interval hyper-networks.

Modules (OR-Tools MathOpt; SCIP, HiGHS, CP-SAT):

* `milp.network`        — Flax parameters / linen models / any affine+ReLU JAX function
                          (`from_function`, e.g. an imported ONNX graph) -> chains of affine
                          layers (float64).
* `milp.bounds`         — IBP and CROWN pre-activation bounds (big-M constants).
* `milp.neighbourhoods` — membership, L-inf ball, sensitive-attribute neighbourhoods.
* `milp.encode`         — MathOpt encodings (exact ReLU, interval weights, shared inputs).
* `milp.solve`          — solving, dual bounds, optimisation queries.
* `milp.verify`         — VERIFIED / FALSIFIED / NOT_VERIFIED / UNKNOWN with replayed
                          counterexamples.
* `milp.ldcp`           — Sphynx's LDCP query (Sphynx, §3 and §5.2), the naive ground truth,
                          Sphynx end to end.
* `milp.parallel`       — independent verification jobs on `boundjax.executor` (process pool
                          or Ray).
* `milp.idpdb`          — LUCID's iDP deterministic bound (a package): node MILP over N and a
                          hyper-network, branch-and-bound over hyper-networks, per-member
                          MILPs, and `compute_betas`, β per class for
                          `boundjax.privacy.LabelOnlyGuard`.
* `milp.property`       — the exact check of a VNNLIB-style property (sat with a replayed
                          counterexample / unsat / timeout / unknown).
* `milp.lipschitz`      — the exact local Lipschitz constant as a MILP (LipMIP), PTR's oracle.

Layering: `milp` imports `boundjax`; nothing in `boundjax` imports `milp` except its demos, the
CLI and the complete verifier `boundjax.verify` (on the same layer as `milp`, for its MILP fallback,
imported lazily).
"""
