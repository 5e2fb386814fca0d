"""Model auditing with finite adversaries: the gaps of Theorems 1-3 and the adversaries themselves.

Diaz, Kairouz, Liao, Sankar, "Theoretical guarantees for model auditing with finite
adversaries"). An auditor fits a *finite adversary* — a two-layer network with ``k`` hidden units
(eq. 5, activation sigma(t) = tanh(t/2)) — on ``n`` samples ``(S_i, T_i)`` to predict a binary
sensitive ``S in {-1, +1}`` from a released ``T``. If its minimal empirical loss
``L_{k,S_n}`` is large, then with probability ``>= 1 - delta`` the minimal true loss over *all*
adversaries satisfies ``L >= L_{k,S_n} - gap`` (eq. 18).

The package holds (all names re-exported here)

* geometry of the support ``K``: `diameter`, `enclosing_radius`, `radius_term`;
* the gaps: `thm1_gap` (representation setting, eq. 22/24), `thm2_gap` (eq. 34), `thm3_gap`
  (eq. 37) and `AuditCertificate` / `certify`;
* the paper's worked example (§5): `sample_gaussian_example`, `eta_from_densities`,
  `equal_cov_eta`, `true_min_loss`, `eq49_gap`;
* exact ERM in the classification setting (`classification_erm`) and approximate ERM over
  ``H_k`` by many restarts in one vmapped, jitted run (`fit_finite_adversary`, optax Adam + SGD).

Corrections to the paper (each repeated where it applies):

* ``C_eta = |<v, v0>|``, not ``<v, v0>`` (eq. 48); every gap takes ``|mu|`` / rejects ``C < 0``.
* Hoeffding: eq. 22/49 (``sqrt(log(1/delta)/(2n))``) is the default, as in Figure 1; the printed
  eq. 31 carries an extra ``sqrt(2)`` and is offered as ``hoeffding="eq31"``.
* Barron's theorem needs ``K`` inside a ball of radius ``r``: the radius term is ``2 r``, which
  equals ``Dia(K)`` only for centrally symmetric ``K`` (boxes). For point clouds we use twice the
  radius of an enclosing ball (`radius_term`).
* Theorem 3's precondition ``n >= 4 (2d + log(1/delta))`` raises a `ValueError`.
* Log-loss adversaries map into ``[0, 1]``.

Soundness caveats: the gap bounds ``L_{k,S_n} - L`` where ``L_{k,S_n}`` is the *exact*
ERM; a trained adversary's loss is an over-estimate of it, so ``trained loss - gap`` is not a
certified lower bound (`certify` records this). ``C_eta`` depends on the population, so outside a
known model it is an estimate.
"""

from boundjax.auditing.adversary import (AdversaryConfig, AdversaryResult, AuditResult,
                                         adversary_apply, audit_representation,
                                         fit_finite_adversary, init_adversary)
from boundjax.auditing.gaps import (AuditCertificate, binary_entropy, certify,
                                    classification_erm, conditional_losses, diameter,
                                    enclosing_radius, equal_cov_eta, eq49_gap, eta_from_densities,
                                    radius_term, sample_gaussian_example, thm1_constants,
                                    thm1_gap, thm2_gap, thm3_gap, thm3_min_n, true_min_loss,
                                    true_min_loss_sech2, truncated_densities)

__all__ = [
    "diameter", "enclosing_radius", "radius_term", "binary_entropy", "thm1_constants", "thm1_gap",
    "eq49_gap", "thm2_gap", "thm3_min_n", "thm3_gap", "AuditCertificate", "certify",
    "truncated_densities", "eta_from_densities", "equal_cov_eta", "sample_gaussian_example",
    "true_min_loss", "true_min_loss_sech2", "classification_erm", "conditional_losses",
    "AdversaryConfig", "AdversaryResult", "adversary_apply", "init_adversary",
    "fit_finite_adversary", "audit_representation", "AuditResult",
]
