"""Privacy mechanisms and accounting built on boundjax certificates.

* `accounting` — composition theorems and per-query budgets.
* `mechanisms` — private prediction from ensembles and smooth sensitivity.
* `label_mechanisms`, `guard`, `baselines`, `evaluation` — LUCID's guarded label-only predictor,
  its baselines and its accuracy comparison (`label_only` gathers them). β for the guard comes
  from the MILP layer above this package (`milp.idpdb.compute_betas`).
"""

from boundjax.privacy.accounting import (Budget, advanced_composition, compose,
                                         laplace_pld_epsilon, per_query_budget,
                                         standard_composition, zcdp_composition)
from boundjax.privacy.baselines import (alibi_noisy_labels, alibi_posterior, naive_idp,
                                        naive_noise, train_alibi, train_dpsgd_baseline,
                                        tune_alibi)
from boundjax.privacy.evaluation import AccuracyTable, accuracy_table, format_table, guard_latency
from boundjax.privacy.guard import GuardAnswer, LabelOnlyGuard, guard_beta, validate_betas
from boundjax.privacy.label_mechanisms import (exponential_mechanism, exponential_probabilities,
                                               keep_probability, predict_with_confidence)
from boundjax.ptr.release import propose_bound, ptr_query, ptr_release, radius_search  # noqa: F401  (PTR)
from boundjax.privacy.mechanisms import (cauchy_response, cauchy_scale, ensemble_cauchy_response,
                                         ensemble_stable_k, global_sensitivity_response,
                                         laplace_smooth_response, noisy_argmax, private_predict,
                                         response_probability, smooth_sensitivity_bound,
                                         smoothness_diagnostic, vote_counts)

__all__ = [
    "Budget", "advanced_composition", "compose", "laplace_pld_epsilon", "per_query_budget",
    "standard_composition", "zcdp_composition",
    "alibi_noisy_labels", "alibi_posterior", "naive_idp", "naive_noise", "train_alibi",
    "train_dpsgd_baseline", "tune_alibi",
    "AccuracyTable", "accuracy_table", "format_table", "guard_latency",
    "GuardAnswer", "LabelOnlyGuard", "guard_beta", "validate_betas",
    "exponential_mechanism", "exponential_probabilities", "keep_probability",
    "predict_with_confidence",
    "cauchy_response", "cauchy_scale", "ensemble_cauchy_response", "ensemble_stable_k",
    "global_sensitivity_response", "laplace_smooth_response", "noisy_argmax", "private_predict",
    "response_probability", "smooth_sensitivity_bound", "smoothness_diagnostic", "vote_counts",
]
