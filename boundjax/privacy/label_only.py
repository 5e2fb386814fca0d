"""LUCID's guarded label-only predictor and the baselines of its accuracy comparison, in one
namespace (a re-export of the modules that hold them).

LUCID answers label-only queries ``f_x(D) = argmax N(x)`` with individual differential privacy
(iDP) for the leave-one-out neighbours ``D \\ {x_D}`` of the training set D:

==========================================  =====================================================
module                                      holds
==========================================  =====================================================
`boundjax.privacy.label_mechanisms`         exponential mechanism, `keep_probability`,
                                            `predict_with_confidence` (LUCID, §3.3, §4)
`boundjax.privacy.guard`                    `LabelOnlyGuard` (LUCID Alg. 2), `GuardAnswer`,
                                            `validate_betas`, `guard_beta`
`boundjax.privacy.baselines`                Naive-Noise, Naive-iDP, ALIBI, DP-SGD
`boundjax.privacy.evaluation`               `accuracy_table`, `format_table`, `guard_latency`
==========================================  =====================================================

The guard takes β per class as input; β itself comes from MILPs, in the layer above boundjax:
``from milp.idpdb import compute_betas``.
"""

from boundjax.privacy.baselines import (AlibiResult, DpSgdResult, NoisedLabels,
                                        alibi_label_flip_probability, alibi_noisy_labels,
                                        alibi_posterior, naive_idp, naive_noise, train_alibi,
                                        train_dpsgd_baseline, train_soft_labels, tune_alibi)
from boundjax.privacy.evaluation import (DP_EPSILONS, IDP_EPSILONS, PAPER_ADULT_2X50,
                                         PAPER_ADULT_CONV, PAPER_HEADLINE, AccuracyRow,
                                         AccuracyTable, Latency,
                                         accuracy_table, format_table, guard_latency)
from boundjax.privacy.guard import (GuardAnswer, LabelOnlyGuard, guard_beta, infer_input_shape,
                                    validate_betas)
from boundjax.privacy.label_mechanisms import (Prediction, exponential_mechanism,
                                               exponential_probabilities, keep_probability,
                                               predict_with_confidence)

__all__ = [
    "AlibiResult", "DpSgdResult", "NoisedLabels", "alibi_label_flip_probability",
    "alibi_noisy_labels", "alibi_posterior", "naive_idp", "naive_noise", "train_alibi",
    "train_dpsgd_baseline", "train_soft_labels", "tune_alibi",
    "DP_EPSILONS", "IDP_EPSILONS", "PAPER_ADULT_2X50", "PAPER_ADULT_CONV", "PAPER_HEADLINE",
    "AccuracyRow", "AccuracyTable", "Latency", "accuracy_table", "format_table", "guard_latency",
    "GuardAnswer", "LabelOnlyGuard", "guard_beta", "infer_input_shape", "validate_betas",
    "Prediction", "exponential_mechanism", "exponential_probabilities", "keep_probability",
    "predict_with_confidence",
]
