"""Privacy mechanisms and accounting built on boundjax certificates."""

from boundjax.privacy.accounting import (Budget, advanced_composition, compose,
                                         laplace_pld_epsilon, per_query_budget,
                                         standard_composition, zcdp_composition)
from boundjax.privacy.label_only import (GuardAnswer, LabelOnlyGuard, accuracy_table,
                                         alibi_noisy_labels, alibi_posterior, compute_betas,
                                         exponential_mechanism, exponential_probabilities,
                                         keep_probability, naive_idp, naive_noise,
                                         per_member_betas, predict_with_confidence,
                                         train_alibi, train_dpsgd_baseline)
from boundjax.privacy.mechanisms import (cauchy_response, cauchy_scale, ensemble_cauchy_response,
                                         ensemble_stable_k, global_sensitivity_response,
                                         laplace_smooth_response, noisy_argmax, private_predict,
                                         response_probability, smooth_sensitivity_bound,
                                         smoothness_diagnostic, vote_counts)

__all__ = [
    "Budget", "advanced_composition", "compose", "laplace_pld_epsilon", "per_query_budget",
    "standard_composition", "zcdp_composition",
    "GuardAnswer", "LabelOnlyGuard", "accuracy_table", "alibi_noisy_labels", "alibi_posterior",
    "compute_betas", "exponential_mechanism", "exponential_probabilities", "keep_probability",
    "naive_idp",
    "naive_noise", "per_member_betas", "predict_with_confidence", "train_alibi",
    "train_dpsgd_baseline",
    "cauchy_response", "cauchy_scale", "ensemble_cauchy_response", "ensemble_stable_k",
    "global_sensitivity_response", "laplace_smooth_response", "noisy_argmax", "private_predict",
    "response_probability", "smooth_sensitivity_bound", "smoothness_diagnostic", "vote_counts",
]
