"""Hyper-networks: one network whose parameters are intervals, containing a family of networks.

A hyper-network is a parameter pytree whose leaves are `boundjax.Interval` boxes (LUCID,
Def. 5.1; Sphynx's interval abstraction: a non-relational domain). Because it is an ordinary
pytree of Intervals, ``bj.ibp(model.apply)(hyper, x_box)`` bounds the outputs of every network it
contains (`hyper_output_bounds`).

Two constructions:

* `from_ensemble`: the exact hull of trained networks, coordinate-wise ``[min_n w^n, max_n w^n]``
  (LUCID Def. 5.1). It contains every member and is the smallest box that does.
* `pred_hyper_net`: Sphynx's PredHyperNet (Sphynx, Alg. 1): train leave-one-out networks
  in rounds of ``k`` (default 400) and predict each parameter's interval over the unseen ones with
  `pred_int` at ``α' = α / P``, until the Jaccard distance between successive rounds is at most
  ``R`` for a fraction ``M`` of the parameters. The guarantee is statistical, per unseen network,
  with probability ``1 - α`` under Lemma 1's assumptions: it is *not* a sound enclosure of all
  ``|D| + 1`` networks, and `sphynx_metrics` measures how far it falls short.

`pred_int` follows Sphynx's PredInt (Fig. 4 and App. A) step by step: median / mean-absolute-deviation normalisation,
Yeo–Johnson with λ restricted to [0, 2] (Gaussian profile likelihood, bounded golden-section search
vectorised over parameters: ``scipy.stats.yeojohnson_normmax`` is unbounded), a Laplace-kernel KDE
with bandwidth ``h = mean |y - median(y)|`` and its closed-form quantiles (computed with
logsumexp), and the inverse maps. Where the closed form is not exact (the quantile falls inside
the data range; ``α' > 1/K`` is a sufficient condition for that) the exact KDE
CDF is inverted by bisection. Everything is float64 numpy; the result is rounded outward to the
parameters' dtype.
"""

from boundjax.hypernet.metrics import (SphynxMetrics, miscoverage, network_abstraction_rate,
                                       overcoverage, sphynx_metrics, weight_abstraction_rate)
from boundjax.hypernet.predicted import PredHyperNetResult, ensemble_trainer, pred_hyper_net
from boundjax.hypernet.predint import (PRED_INT_VARIANTS, l1_normalize, laplace_kde_cdf,
                                       laplace_kde_interval, pred_int, yeo_johnson,
                                       yeo_johnson_inv, yj_gaussian_loglik, yj_lambda_mle)
from boundjax.hypernet.tree import (HyperNetwork, contains, contains_members, flat_bounds,
                                    flatten_params, flatten_stacked, from_ensemble,
                                    from_flat_bounds, hyper_output_bounds, interval_leaves,
                                    jaccard, point)

__all__ = [
    "HyperNetwork",
    "from_ensemble",
    "point",
    "interval_leaves",
    "contains",
    "contains_members",
    "flatten_params",
    "flatten_stacked",
    "flat_bounds",
    "from_flat_bounds",
    "jaccard",
    "l1_normalize",
    "yeo_johnson",
    "yeo_johnson_inv",
    "yj_gaussian_loglik",
    "yj_lambda_mle",
    "laplace_kde_cdf",
    "laplace_kde_interval",
    "pred_int",
    "PredHyperNetResult",
    "pred_hyper_net",
    "ensemble_trainer",
    "weight_abstraction_rate",
    "miscoverage",
    "overcoverage",
    "network_abstraction_rate",
    "sphynx_metrics",
    "SphynxMetrics",
    "hyper_output_bounds",
]
