"""Abstract Gradient Training: interval bounds on parameters through SGD ("Certification for
Differentially Private Prediction in Gradient-Based Training", AGT).

* `Config` (`boundjax.agt.config`): the run's hyper-parameters, checked at construction.
* `fit`, `fit_k_grid`, `make_step`, `update`, `init`, `State` (`boundjax.agt.train`): the interval
  training loop over a `boundjax.training.Schedule`; its results `FitResult` (with one
  `EpochRecord` per validated epoch) and `KGrid`.
* `certify`, `max_certified_k`, `predict`, `check_shared_nominal` (`boundjax.agt.certify`):
  certified prediction stability from a parameter box.
* `transform`, `bounded_sgd`, `bounded_sgdm`, `bounded_adam`, `point_box`, `ParamBox`,
  `Directions`, `BoundedState` (`boundjax.agt.optim`): the interval optimisers as optax-style
  ``(init, update)`` pairs for a user's own loop (with `descent_directions` per batch);
  `fit` runs the same pairs.
* `clip`, `descent_bounds`, `semin`, `semax` (`boundjax.agt.descent`): the descent-direction
  bounds of AGT's Thm 4.6 (§4.2), with SEMin/SEMax the sums of the smallest/largest values.
* `retrain` (`boundjax.agt.retrain`): empirical soundness checks by real retraining.
* `poisoning`, `poison_attacks`: poisoning certificates (``Config(k_poison=..., epsilon=...,
  label_k_poison=...)``; Sosnin et al., "Certified Robustness to Data Poisoning in
  Gradient-Based Training") and their soundness checks by retraining on poisoned data.
* `VacuousCertificateWarning`, `VacuityCheck`, `BoxOverflowError` (`boundjax.agt.diagnostics`):
  the box certifies (almost) nothing (and the rule that decides it) / overflowed during `fit`.
"""

from boundjax.agt.certify import certify, check_shared_nominal, max_certified_k, predict
from boundjax.agt.config import Config
from boundjax.agt.descent import clip, descent_bounds, descent_bounds_dense, semax, semin
from boundjax.agt.optim import (BoundedState, BoundedTransformation, Directions, ParamBox,
                                bounded_adam, bounded_sgd, bounded_sgdm, point_box, transform,
                                with_vacuity_check)
from boundjax.agt.train import (EpochRecord, FitResult, KGrid, State, batches,
                                descent_directions, fit, fit_k_grid, init, make_step,
                                point_optimizer, update)
from boundjax.agt import poison_attacks, poisoning, retrain  # noqa: E402
from boundjax.agt.diagnostics import (BoxOverflowError, VacuityCheck,
                                      VacuousCertificateWarning)
from boundjax.training import Schedule

__all__ = [
    "Config", "Schedule", "State", "FitResult", "EpochRecord", "KGrid", "init", "make_step",
    "update", "fit", "batches", "point_optimizer", "certify", "max_certified_k", "fit_k_grid",
    "check_shared_nominal", "predict", "clip", "descent_bounds", "descent_bounds_dense", "semin",
    "semax", "retrain", "VacuousCertificateWarning", "VacuityCheck", "BoxOverflowError",
    "transform",
    "bounded_sgd", "bounded_sgdm", "bounded_adam", "point_box", "ParamBox", "Directions",
    "BoundedState", "BoundedTransformation", "descent_directions", "poisoning", "poison_attacks",
    "with_vacuity_check",
]
