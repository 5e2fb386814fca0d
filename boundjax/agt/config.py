"""Configuration of Abstract Gradient Training (AGT, App. E, and the public code's ``AGTConfig``).

Field names follow the public AGT code where it has them (``k_private``, ``clip_gamma``,
``learning_rate``, ``lr_decay``, ``lr_min``, ``n_epochs``, ``loss``, ``optimizer``, ``l1_reg``,
``l2_reg``, ``fragsize``); ``batch_size`` comes from its figure scripts. The momentum options
are flat fields instead of the code's ``optimizer_kwargs`` dictionary. Option names shared with
the rest of boundjax follow `boundjax.ibp`: ``sound`` (outward rounding; was ``fp_margin``) and
``matmul`` (the interval product; was ``interval_matmul``, whose "rump" is "midrad" and whose
"exact" is "signsplit"). The old names are gone: nothing in the package, its notebooks or
benchmarks used them, and as init-only aliases they read back as ``None``.

Every option is checked when the `Config` is built (`ValueError` naming the field): unknown names,
NaN or infinite numbers, and combinations the bounds do not cover.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Literal, Optional

from boundjax.training import Schedule

LOSSES = ("cross_entropy", "binary_cross_entropy", "mse")
OPTIMIZERS = ("sgd", "sgdm", "adam")
NEIGHBOURHOODS = ("add_remove", "remove")
NORMALISATIONS = ("actual", "nominal")
BOUND_METHODS = ("interval", "crown")
#: Interval products, in `boundjax.ibp`'s vocabulary (both back-ends, `boundjax.agt.bounds`).
MATMULS = ("midrad", "signsplit", "exact", "best")
_NUMBERS = ("learning_rate", "clip_gamma", "lr_decay", "lr_min", "momentum", "dampening",
            "l1_reg", "l2_reg", "b1", "b2", "eps_adam", "weight_decay")
_INTS = ("n_epochs", "batch_size", "k_private", "fragsize", "seed")
#: Poisoning fields, named as in the public code's ``AGTConfig`` (`boundjax.agt.poisoning`).
_POISON_INTS = ("k_poison", "label_k_poison", "poison_target_idx")
_POISON_NUMBERS = ("epsilon", "label_epsilon")


@dataclasses.dataclass(frozen=True)
class Config:
  """Hyper-parameters of one AGT run (Alg. 1 of the AGT paper, privacy variant).

  Attributes:
    n_epochs: number of passes over the data (E).
    learning_rate: initial step size alpha.
    batch_size: fixed batch size b; incomplete last batches are dropped.
    loss: "cross_entropy" (integer labels, one logit per class), "binary_cross_entropy"
      (one logit, labels in {0, 1}) or "mse" (per-sample mean squared error over outputs).
    k_private: k, the number of points that may be removed from *and* added to every batch
      (AGT paper, Thm 4.6 in §4.2). Must be < batch_size.
    neighbourhood: "add_remove" (the privacy variant: up to k removals and k additions per
      batch, Thm 4.6) or "remove" (unlearning: up to k removals per batch only,
      each batch's mean taken over the points left, ``SEMin_{b-k}(delta_L) / (b - k)`` (SEMin:
      the sum of the b - k smallest, AGT paper, Thm 4.6 in §4.2) and
      ``SEMax_{b-k}(delta_U) / (b - k)``, the public code's unlearning rule; no clipping
      needed). "remove" encloses every leave-k-out network that
      `boundjax.ensembles.train_ensemble` trains (the masked mean divides by the points left);
      the mean after dropping the k largest lower bounds is below the mean after dropping
      fewer, so r < k removals are covered too.
    clip_gamma: gamma, element-wise clipping level of per-sample gradients (AGT, §4.2), or None
      (no clipping; ``math.inf`` is read as None). Must be given when k_private > 0 with
      "add_remove" (each added point contributes up to +-gamma).
    lr_decay: eta in alpha_n = max(alpha / (1 + eta * n), lr_min) (AGT, App. E).
    lr_min: floor of the step size.
    optimizer: "sgd", "sgdm" (heavy-ball momentum, torch convention
      v <- momentum * v + (1 - dampening) * g, Nesterov g <- g + momentum * v) or "adam"
      (Adam as ``optax.adam``, AdamW with ``weight_decay``; bounds in `boundjax.agt.optim`).
    momentum, dampening, nesterov: options of "sgdm".
    b1, b2, eps_adam: options of "adam" (optax's ``b1``, ``b2``, ``eps``): moment decays in
      [0, 1) and the denominator term eps > 0.
    weight_decay: AdamW's decoupled weight decay (>= 0; "adam" only; ``optax.adamw``).
      ``l2_reg`` with "adam" is the coupled penalty added to the gradient before Adam.
    l1_reg: lambda of an L1 penalty lambda * |theta|_1 (SGD only, as in the public code).
    l2_reg: lambda of an L2 penalty (lambda / 2) |theta|^2, i.e. gradient lambda * theta; needs
      learning_rate * l2_reg <= 1 for the interval update to stay monotone.
    bound_method: forward bound over the parameter box: "interval" (IBP, the paper's choice)
      or "crown" (`boundjax.crown` over the parameter box with the sample's input fixed, as
      the public code's CROWNBoundedModel, intersected with the interval ones;
      `boundjax.agt.crown`). It tightens the logit bounds of the certificates with either
      back-end and, with the "mlp" back-end, the activation bounds that feed the gradient
      bounds, from two hidden layers on.
    matmul: the interval matrix product (`boundjax.ibp`'s vocabulary): "midrad" (midpoint-radius,
      4 products; the public code's default "rump") or "signsplit" (sign-split products; exact
      when one factor is sign-definite, e.g. post-ReLU activations), "exact" (four-corner bound
      per term; materialises the product) or "best" (midrad met with signsplit).
    fragsize: the most samples bounded at once; the chunk is also kept within
      `boundjax.agt.descent.CHUNK_BYTES` per per-sample array (`descent.chunk_size`), so
      memory is O(chunk * #params + k * #params) whatever the batch. It does not change the
      bounds (up to the rounding order of the sums).
    seed: seed of the default data order (`schedule`: shuffled once, then fixed).
    sound: the sound floating-point mode: widen every step outward by a worst-case bound
      on the rounding error of the batch sums and of the update
      (`boundjax.agt.descent.rounding_margin`), so that retrained runs computed in the same
      floating point stay inside the box (without it, float64 retraining found violations of
      1e-17). Off by default, as in the public code: the worst-case bound grows with b * eps
      and in float32 with large batches it widens the box enough to cost certificates; use it
      with float64 when certificates must hold bit-for-bit. The per-sample gradient bounds
      themselves use ordinary rounding in both modes.
    k_poison: poisoning certificates (Sosnin et al., "Certified Robustness to Data Poisoning
      in Gradient-Based Training", the public AGT code's ``poison_certified_training``;
      `boundjax.agt.poisoning`): per batch, up to ``k_poison`` samples may each have their
      features moved anywhere in the L-infinity ball of radius ``epsilon`` (not clipped to
      the data range). Cannot be combined with ``k_private``.
    epsilon: radius of the feature poisoning (>= 0; 0 = no feature poisoning).
    label_k_poison: per batch, up to this many samples may have their label changed: for
      "cross_entropy"/"binary_cross_entropy" to any other class (a flip), for "mse" every
      target moves by up to ``label_epsilon``.
    label_epsilon: radius of the target perturbation for "mse" (>= 0; must be 0 for the
      classification losses, where a flip is not a distance).
    poison_target_idx: -1 (default): untargeted label poisoning. Otherwise, as in the public
      code's ``poison_target_idx``, a poisoned label can only be changed *to* this class (the
      label becomes either its own value or this class; for "binary_cross_entropy" 0 or 1);
      for "mse" only the target of this output moves (by up to ``label_epsilon``).
    paired_poison: False (default): the feature-poisoned and the label-poisoned samples may be
      different, so up to ``k_poison + label_k_poison`` samples of a batch change. True: the
      same samples carry both (at most ``max(k_poison, label_k_poison)`` samples change, each
      in features and label), the rule of the public code, which always uses the max.
    normalise: the mean whose neighbours the box covers (`boundjax.agt.descent`): "actual"
      (default) ``sum / |B~|``, SGD on the batch actually drawn, the training algorithm of
      the privacy argument (AGT, Alg. 1 and Thm 4.6, whose bound is exact for it); or
      "nominal", the fixed ``1/b`` convention ``sum / b``, which Thm 4.6 covers only when no
      batch grows (additions <= removals): its own bound drops only the removals that help
      and is wider; it also covers "actual". The nominal run is the same either way.
  """

  n_epochs: int
  learning_rate: float
  batch_size: int
  loss: Literal["cross_entropy", "binary_cross_entropy", "mse"] = "binary_cross_entropy"
  k_private: int = 0
  neighbourhood: Literal["add_remove", "remove"] = "add_remove"
  clip_gamma: Optional[float] = None
  lr_decay: float = 0.0
  lr_min: float = 0.0
  optimizer: Literal["sgd", "sgdm", "adam"] = "sgd"
  momentum: float = 0.0
  dampening: float = 0.0
  nesterov: bool = False
  b1: float = 0.9
  b2: float = 0.999
  eps_adam: float = 1e-8
  weight_decay: float = 0.0
  l1_reg: float = 0.0
  l2_reg: float = 0.0
  bound_method: Literal["interval", "crown"] = "interval"
  matmul: Literal["midrad", "signsplit", "exact", "best"] = "midrad"
  fragsize: int = 10_000
  seed: int = 0
  sound: bool = False
  normalise: Literal["actual", "nominal"] = "actual"
  k_poison: int = 0
  epsilon: float = 0.0
  label_k_poison: int = 0
  label_epsilon: float = 0.0
  poison_target_idx: int = -1
  paired_poison: bool = False

  def __post_init__(self):
    def bad(msg):
      raise ValueError(f"agt.Config: {msg}")
    if self.clip_gamma == math.inf:      # the old spelling of "no clipping"
      object.__setattr__(self, "clip_gamma", None)
    for name in _INTS:
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        bad(f"{name} must be an int, got {v!r}.")
      object.__setattr__(self, name, int(v))
    for name in _NUMBERS:
      v = getattr(self, name)
      if v is None and name == "clip_gamma":
        continue
      if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
        bad(f"{name} must be a finite number, got {v!r}.")
    if not isinstance(self.sound, bool) or not isinstance(self.nesterov, bool):
      bad(f"sound and nesterov must be bools, got {self.sound!r}, {self.nesterov!r}.")
    if not isinstance(self.n_epochs, int) or self.n_epochs < 1:
      bad(f"n_epochs must be a positive int, got {self.n_epochs!r}.")
    if not isinstance(self.batch_size, int) or self.batch_size < 1:
      bad(f"batch_size must be a positive int, got {self.batch_size!r}.")
    if not self.learning_rate > 0:
      bad(f"learning_rate must be > 0, got {self.learning_rate!r}.")
    if self.loss not in LOSSES:
      bad(f"loss must be one of {LOSSES}, got {self.loss!r}.")
    if self.optimizer not in OPTIMIZERS:
      bad(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}.")
    if self.bound_method not in BOUND_METHODS:
      bad(f"bound_method must be one of {BOUND_METHODS}, got {self.bound_method!r}.")
    if self.matmul not in MATMULS:
      bad(f"matmul must be one of {MATMULS}, got {self.matmul!r}.")
    if not isinstance(self.k_private, int) or self.k_private < 0:
      bad(f"k_private must be a non-negative int, got {self.k_private!r}.")
    if self.k_private >= self.batch_size:
      bad(f"k_private ({self.k_private}) must be < batch_size ({self.batch_size}) (Thm 4.6).")
    if self.clip_gamma is not None and not self.clip_gamma > 0:
      bad(f"clip_gamma must be > 0 (or None: no clipping), got {self.clip_gamma!r}.")
    if self.normalise not in NORMALISATIONS:
      bad(f"normalise must be one of {NORMALISATIONS}, got {self.normalise!r}.")
    if self.neighbourhood not in NEIGHBOURHOODS:
      bad(f"neighbourhood must be one of {NEIGHBOURHOODS}, got {self.neighbourhood!r}.")
    if self.k_private > 0 and self.neighbourhood == "add_remove" and self.clip_gamma is None:
      bad("clip_gamma must be finite when k_private > 0: each added point moves the descent "
          "direction by up to clip_gamma per coordinate (Thm 4.6).")
    if self.lr_decay < 0 or self.lr_min < 0:
      bad(f"lr_decay and lr_min must be >= 0, got {self.lr_decay!r}, {self.lr_min!r}.")
    if not 0 <= self.momentum < 1 or not 0 <= self.dampening <= 1:
      bad(f"need 0 <= momentum < 1 and 0 <= dampening <= 1, got {self.momentum!r}, "
          f"{self.dampening!r}.")
    if self.optimizer != "sgdm" and (self.momentum or self.nesterov or self.dampening):
      bad(f"momentum/dampening/nesterov given with optimizer={self.optimizer!r}; they are "
          "options of optimizer='sgdm'.")
    if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1):
      bad(f"b1 and b2 must lie in [0, 1), got {self.b1!r}, {self.b2!r}.")
    if not self.eps_adam > 0:
      bad(f"eps_adam must be > 0 (it keeps Adam's denominator positive), got {self.eps_adam!r}.")
    if self.weight_decay < 0 or (self.weight_decay > 0 and self.optimizer != "adam"):
      bad(f"weight_decay must be >= 0 and is an option of optimizer='adam' (AdamW), got "
          f"{self.weight_decay!r} with optimizer={self.optimizer!r}; use l2_reg otherwise.")
    if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
      bad("nesterov needs momentum > 0 and dampening == 0 (as in torch.optim.SGD).")
    if self.l1_reg < 0 or self.l2_reg < 0:
      bad(f"l1_reg and l2_reg must be >= 0, got {self.l1_reg!r}, {self.l2_reg!r}.")
    if self.l1_reg > 0 and (self.l2_reg > 0 or self.optimizer != "sgd"):
      bad("l1_reg cannot be combined with l2_reg or momentum (as in the public code).")
    if self.l2_reg * max(self.learning_rate, self.lr_min) > 1:
      bad(f"learning_rate * l2_reg must be <= 1 for a monotone interval update, got "
          f"{self.learning_rate * self.l2_reg!r}.")
    if not isinstance(self.fragsize, int) or self.fragsize < 1:
      bad(f"fragsize must be a positive int, got {self.fragsize!r}.")
    self._check_poisoning(bad)

  def _check_poisoning(self, bad) -> None:
    """Checks the poisoning fields (`boundjax.agt.poisoning`)."""
    for name in _POISON_INTS:
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        bad(f"{name} must be an int, got {v!r}.")
      object.__setattr__(self, name, int(v))
    for name in _POISON_NUMBERS:
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
        bad(f"{name} must be a finite number >= 0, got {v!r}.")
      object.__setattr__(self, name, float(v))
    if not isinstance(self.paired_poison, bool):
      bad(f"paired_poison must be a bool, got {self.paired_poison!r}.")
    for name in ("k_poison", "label_k_poison"):
      if getattr(self, name) < 0:
        bad(f"{name} must be a non-negative int, got {getattr(self, name)!r}.")
    if self.poison_target_idx < -1:
      bad(f"poison_target_idx must be -1 (untargeted) or a class/output index >= 0, got "
          f"{self.poison_target_idx!r}.")
    if self.loss == "binary_cross_entropy" and self.poison_target_idx > 1:
      bad(f"poison_target_idx must be -1, 0 or 1 with binary_cross_entropy, got "
          f"{self.poison_target_idx!r}.")
    if self.label_epsilon > 0 and self.loss != "mse":
      bad(f"label_epsilon ({self.label_epsilon!r}) is for 'mse' targets; with {self.loss!r} "
          "a poisoned label is any other class (set label_k_poison, leave label_epsilon 0).")
    if not self.poisoning:
      return
    if self.k_private > 0:
      bad("k_private and k_poison/label_k_poison cannot be combined: privacy and poisoning "
          "certificates are separate runs.")
    budget = self.poison_budget
    if budget >= self.batch_size:
      rule = ("max(k_poison, label_k_poison)" if self.paired_poison
              else "k_poison + label_k_poison")
      bad(f"the poisoned samples per batch ({rule} = {budget}) must be < batch_size "
          f"({self.batch_size}).")

  @property
  def poisoning(self) -> bool:
    """True when this run bounds poisoning (``k_poison`` or ``label_k_poison`` > 0)."""
    return self.k_poison > 0 or self.label_k_poison > 0

  @property
  def poison_budget(self) -> int:
    """Samples of one batch that may change: ``max(k_poison, label_k_poison)`` when
    ``paired_poison``, else ``k_poison + label_k_poison``."""
    if self.paired_poison:
      return max(self.k_poison, self.label_k_poison)
    return self.k_poison + self.label_k_poison

  @property
  def gamma(self) -> float:
    """The clipping level as a number: ``clip_gamma``, or ``inf`` when there is no clipping."""
    return math.inf if self.clip_gamma is None else float(self.clip_gamma)

  def schedule(self, n: int):
    """AGT's default data order for ``n`` points: one permutation (seeded by ``seed``) visited
    in every epoch, the last incomplete batch dropped (AGT, §3.2; the public code)."""
    return Schedule(n=n, batch_size=self.batch_size, epochs=self.n_epochs, seed=self.seed,
                    shuffle="once", last_batch="drop")

  def lr(self, n):
    """Step size of step ``n`` (0-based): ``max(alpha / (1 + eta * n), lr_min)`` (AGT, App. E)."""
    import jax.numpy as jnp
    return jnp.maximum(self.learning_rate / (1.0 + self.lr_decay * n), self.lr_min)
