"""Post-hoc privacy of collaborative inference with propose-test-release (PTR; Singh et al.,
"Posthoc privacy guarantees for collaborative inference with modified Propose-Test-Release").

* `lipschitz`: sound local Lipschitz bounds of an encoder over an L∞ box (the test's statistic).
* `release`: the PTR mechanism: proposal ``Δp``, radius search, test and calibrated release
  (also re-exported by `boundjax.privacy`).
* `pipeline`: the end-to-end pipeline: β-VAE embedder, ARL obfuscator, baselines, the
  reconstruction attack and the accuracy with its answer rate.

The exact Lipschitz constant as a MILP (LipMIP) is `milp.lipschitz`, a layer above.
Importing this package loads none of its modules; import the one you need.
"""
