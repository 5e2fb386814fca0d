"""Abstract Gradient Training: interval bounds on parameters through SGD (AGT paper 001)."""

from boundjax.agt.certify import (certify, check_shared_nominal, fit_k_grid, max_certified_k,
                                  predict)
from boundjax.agt.config import Config
from boundjax.agt.descent import clip, descent_bounds, descent_bounds_dense, semax, semin
from boundjax.agt.train import State, batches, fit, init, make_step, update
from boundjax.agt import retrain  # noqa: E402

__all__ = [
    "Config", "State", "init", "make_step", "update", "fit", "batches",
    "certify", "max_certified_k", "fit_k_grid", "check_shared_nominal", "predict",
    "clip", "descent_bounds", "descent_bounds_dense", "semin", "semax", "retrain",
]
