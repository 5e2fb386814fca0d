"""The baselines of LUCID's accuracy comparison (LUCID, §3.3 and §7; ε-DP implies ε-iDP).

=====================  ==================================================  =================
mechanism              what it does                                        guarantee
=====================  ==================================================  =================
`naive_noise`          exponential mechanism on every query (Δu = 1)       ε-DP (per query)
`naive_idp`            all |D|+1 networks per query, noise on disagreement ε-iDP (per query)
`train_alibi`          ALIBI: Laplace-noised one-hot training labels,      ε-label-DP
                       Bayesian posterior soft labels, model trained on
                       them (Malek et al. 2021)
`tune_alibi`           ALIBI with its options chosen on a split of its own ε-label-DP
                       noisy labels (one release; no composition)
`train_dpsgd_baseline` DP-SGD (`boundjax.training.dpsgd`, optax + dp-accounting)    (ε, δ)-DP
=====================  ==================================================  =================
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.privacy.label_mechanisms import (check_epsilon, n_classes_of, one_hot_mechanism,
                                               output_kind, predict_with_confidence)

PyTree = Any
ApplyFn = Callable[[PyTree, jax.Array], jax.Array]


def network_outputs(apply_fn: ApplyFn, params: PyTree, x: Any, output: str | None
                    ) -> tuple[jax.Array, str]:
  """``(apply_fn(params, x), "logits" | "sign")`` for float32 inputs ``x``."""
  z = apply_fn(params, jnp.asarray(x, jnp.float32))
  return z, output_kind(int(z.shape[-1]), output)


def _int_seed(key: jax.Array) -> int:
  """An int seed drawn from ``key``, for trainers that take one."""
  return int(jax.random.randint(key, (), 0, 2**31 - 1))


# ---------------------------------------------------------------------------------------------
# Naive-Noise and Naive-iDP (LUCID, §3.3)
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class NoisedLabels:
  """Labels released by `naive_idp`: ``labels`` (n,) int64, ``noised`` (n,) bool."""

  labels: np.ndarray
  noised: np.ndarray


def naive_noise(key: jax.Array, apply_fn: ApplyFn, params: PyTree, x: Any, epsilon: float,
                output: str | None = None) -> np.ndarray:
  """Naive-Noise: the exponential mechanism on every query (Δu = 1 = the global sensitivity).

  ε-DP per query (hence ε-iDP). Keeps N's label with probability ``e^{ε/2} / (e^{ε/2} + |C| -
  1)``: 0.5 / 0.5025 / 0.525 / 0.622 for two classes at ε = 0 / 0.02 / 0.2 / 1 (LUCID, §3.3; Table
  2's Naive-Noise column).
  Returns the ``(n,)`` int64 labels.
  """
  eps = check_epsilon(epsilon)
  z, kind = network_outputs(apply_fn, params, x, output)
  label = predict_with_confidence(z, kind).label
  k = n_classes_of(kind, int(z.shape[-1]))
  return np.asarray(one_hot_mechanism(key, label, k, eps), np.int64)


def naive_idp(key: jax.Array, apply_fn: ApplyFn, params: PyTree, members: PyTree, x: Any,
              epsilon: float, output: str | None = None, chunk: int = 2048) -> NoisedLabels:
  """Naive-iDP: every query through N and all leave-one-out networks (vmapped over ``members``,
  a parameter tree with a leading member axis); N's label when all agree, else the
  exponential-mechanism label (LUCID, §3.3).

  ε-iDP per query when ``members`` is the whole leave-one-out family of D (the exact leaking set,
  the least noise possible); with only part of the family it guarantees nothing. Inputs go
  through the members ``chunk`` at a time (memory ``members x chunk x width``).
  """
  eps = check_epsilon(epsilon)
  xs = jnp.asarray(x, jnp.float32)
  z, kind = network_outputs(apply_fn, params, xs, output)
  label = predict_with_confidence(z, kind).label

  def disagree(xb, lb):
    zm = jax.vmap(apply_fn, in_axes=(0, None))(members, xb)
    ml = jax.vmap(lambda o: predict_with_confidence(o, kind).label)(zm)
    return jnp.any(ml != lb[None], axis=0)

  noised = jnp.concatenate([disagree(xs[i:i + chunk], label[i:i + chunk])
                            for i in range(0, xs.shape[0], chunk)])
  drawn = one_hot_mechanism(key, label, n_classes_of(kind, int(z.shape[-1])), eps)
  return NoisedLabels(np.asarray(jnp.where(noised, drawn, label), np.int64), np.asarray(noised))


# ---------------------------------------------------------------------------------------------
# ALIBI (label DP; Malek et al. 2021, LUCID, §7)
# ---------------------------------------------------------------------------------------------

def alibi_noisy_labels(key: jax.Array, y: Any, n_classes: int, epsilon: float) -> np.ndarray:
  """ALIBI's randomised response: ``o = onehot(y) + Lap(λ)^{|C|}``, ``λ = 2 / ε``.

  The one-hot vector has L1 sensitivity 2 under a change of one label, so releasing ``o`` is
  ε-label-DP (Laplace mechanism); everything computed from ``o`` (the posterior, the trained
  model) inherits it. Returns ``(n, |C|)`` float64.
  """
  eps = check_epsilon(epsilon, allow_zero=False)
  yy = np.asarray(y, np.int64)
  if yy.ndim != 1 or (yy.size and (yy.min() < 0 or yy.max() >= n_classes)):
    raise ValueError(f"alibi_noisy_labels: y must be a vector of labels in [0, {n_classes}).")
  noise = np.asarray(jax.random.laplace(key, (yy.size, n_classes), jnp.float32), np.float64)
  return np.eye(n_classes)[yy] + noise * (2.0 / eps)


def alibi_posterior(noisy: Any, epsilon: float, prior: Any = None) -> np.ndarray:
  """ALIBI's Bayesian step: ``P(y = k | o) ∝ p_k exp(-||o - e_k||_1 / λ)``, ``λ = 2 / ε``.

  ``||o - e_k||_1 = Σ_j |o_j| - |o_k| + |o_k - 1|``, so only ``|o_k| - |o_k - 1|`` varies with k.
  ``prior``: ``(|C|,)`` or per-example ``(n, |C|)`` (uniform when None). Returns soft labels.
  """
  eps = check_epsilon(epsilon, allow_zero=False)
  o = np.asarray(noisy, np.float64)
  lam = 2.0 / eps
  logits = (np.abs(o) - np.abs(o - 1.0)) / lam
  if prior is not None:
    p = np.broadcast_to(np.asarray(prior, np.float64), o.shape)
    logits = logits + np.log(np.maximum(p, 1e-300))
  logits -= logits.max(axis=1, keepdims=True)
  w = np.exp(logits)
  return w / w.sum(axis=1, keepdims=True)


def alibi_label_flip_probability(epsilon: float, n_classes: int = 2) -> float:
  """P(the posterior's argmax label differs from the true label), uniform prior.

  Two classes: the MAP label is wrong when ``g(o_wrong) > g(o_true)``, ``g(t) = |t| - |t - 1|``
  (clipped ramp), half the time on a tie; computed by numerical integration over the Laplace
  densities (exact up to quadrature error). Used to check the noise in tests.
  """
  eps = check_epsilon(epsilon, allow_zero=False)
  if n_classes != 2:
    raise ValueError("alibi_label_flip_probability: only two classes are tabulated.")
  from scipy import integrate, stats
  lam = 2.0 / eps
  lap = stats.laplace(scale=lam)
  # o_t = 1 + L1, o_w = L2. g(o) = clip(2o - 1, -1, 1). Wrong iff g(L2) > g(1 + L1); tie half.
  # g(1 + L1) = clip(1 + 2 L1, -1, 1).

  def p_wrong_given(l1: float) -> float:
    gt = float(np.clip(1 + 2 * l1, -1, 1))
    if gt >= 1:           # wrong only on the tie g(L2) = 1, i.e. L2 >= 1
      return 0.5 * lap.sf(1.0)
    if gt <= -1:          # right only on the tie g(L2) = -1, i.e. L2 <= 0
      return 1 - 0.5 * lap.cdf(0.0)
    # g(L2) > gt  <=>  2 L2 - 1 > gt  <=>  L2 > (gt + 1) / 2
    return lap.sf((gt + 1) / 2)

  val, _ = integrate.quad(lambda l1: p_wrong_given(l1) * lap.pdf(l1), -50 * lam, 50 * lam,
                          points=[-1.0, 0.0], limit=400)
  return float(val)


def _soft_ce(kind: str):
  import optax
  if kind == "sign":
    return lambda z, t: optax.sigmoid_binary_cross_entropy(z.reshape(z.shape[0], -1)[:, 0],
                                                           t[:, 1])
  return lambda z, t: optax.softmax_cross_entropy(z, t)


def train_soft_labels(apply_fn: ApplyFn, init_params: PyTree, x: Any, soft: Any, *,
                      epochs: int, batch_size: int, lr: float = 0.1, weight_decay: float = 1e-5,
                      key: jax.Array | None = None, output: str | None = None) -> PyTree:
  """SGD on soft labels ``(n, |C|)`` with `boundjax.ensembles.train_single` (LUCID's optimiser);
  ``key`` orders the batches (default ``PRNGKey(0)``)."""
  from boundjax import ensembles as E
  n_out = int(apply_fn(init_params, jnp.asarray(np.asarray(x)[:1], jnp.float32)).shape[-1])
  kind = output_kind(n_out, output)
  seed = 0 if key is None else _int_seed(key)
  return E.train_single(apply_fn, init_params, E.sgd(lr, weight_decay=weight_decay),
                        np.asarray(x, np.float32), np.asarray(soft, np.float32), epochs=epochs,
                        batch_size=batch_size, seed=seed, loss_fn=_soft_ce(kind))


class _TrainedBaseline:
  """A trained baseline: its ``params`` and its account (every other field)."""

  def info(self) -> dict:
    """Every field but ``params`` (JSON-ready)."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "params"}


@dataclasses.dataclass
class AlibiResult(_TrainedBaseline):
  """`train_alibi`'s model and account.

  Attributes:
    params: the trained parameters.
    epsilon: the label-DP budget; ``lam``: the Laplace scale ``2 / ε``.
    posterior_label_agreement: fraction of posterior argmax labels equal to the true labels.
    iterations: rounds of ALIBI's iterative Bayesian inference.
    seconds: training time.
    guarantee: ``"eps-label-DP"``.
  """

  params: PyTree = dataclasses.field(repr=False)
  epsilon: float
  lam: float
  posterior_label_agreement: float
  iterations: int
  seconds: float
  guarantee: str = "eps-label-DP"


def train_alibi(apply_fn: ApplyFn, init_params: PyTree, x: Any, y: Any, epsilon: float, *,
                n_classes: int = 2, epochs: int = 30, batch_size: int = 1024, lr: float = 0.1,
                weight_decay: float = 1e-5, iterations: int = 1, key: jax.Array | None = None,
                output: str | None = None, noisy: Any = None) -> AlibiResult:
  """ALIBI (Malek et al. 2021; LUCID, §7): ε-label-DP training.

  1. `alibi_noisy_labels`: ``o_i = onehot(y_i) + Lap(2/ε)`` (the only access to the labels);
  2. `alibi_posterior` with a uniform prior (post-processing);
  3. train on the soft labels (`train_soft_labels`); with ``iterations > 1`` the model's softmax
     on the training inputs becomes each example's prior and the model is retrained from the same
     initial parameters (ALIBI's iterative Bayesian inference; features are public under label
     DP, so this stays post-processing).

  The guarantee is ε-DP with respect to the training labels (label DP), hence ε-iDP for label
  changes; it does not protect the features. ``key`` (default ``PRNGKey(0)``) draws the label
  noise and the batch order. ``noisy``: the released noisy labels of ``x`` (`alibi_noisy_labels`
  at this ``epsilon``) when they were drawn already (`tune_alibi`); ``y`` is then only used to
  report ``posterior_label_agreement``.
  """
  eps = check_epsilon(epsilon, allow_zero=False)
  if iterations < 1:
    raise ValueError(f"train_alibi: iterations must be >= 1, got {iterations}.")
  key = jax.random.PRNGKey(0) if key is None else key
  k_noise, k_train = jax.random.split(key)
  t0 = time.perf_counter()
  if noisy is None:
    noisy = alibi_noisy_labels(k_noise, y, n_classes, eps)
  noisy = np.asarray(noisy, np.float64)
  if noisy.shape != (np.shape(x)[0], n_classes):
    raise ValueError(f"train_alibi: noisy labels have shape {noisy.shape}, expected "
                     f"({np.shape(x)[0]}, {n_classes}).")
  soft = alibi_posterior(noisy, eps)          # first round: uniform prior, as ALIBI starts
  params = init_params
  for it in range(iterations):
    params = train_soft_labels(apply_fn, init_params, x, soft, epochs=epochs,
                               batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                               key=k_train, output=output)
    if it + 1 < iterations:
      z = apply_fn(params, jnp.asarray(x, jnp.float32))
      if z.shape[-1] == 1:
        p1 = np.asarray(jax.nn.sigmoid(z[:, 0]), np.float64)
        model_prior = np.stack([1 - p1, p1], axis=1)
      else:
        model_prior = np.asarray(jax.nn.softmax(z, axis=-1), np.float64)
      soft = alibi_posterior(noisy, eps, np.clip(model_prior, 1e-6, 1.0))
  agree = float(np.mean(np.argmax(soft, 1) == np.asarray(y)))
  return AlibiResult(params, eps, 2.0 / eps, agree, iterations, time.perf_counter() - t0)


def tune_alibi(apply_fn: ApplyFn, init_params: PyTree, x: Any, y: Any, epsilon: float,
               grid: list[dict], *, val_fraction: float = 0.2, n_classes: int = 2,
               key: jax.Array | None = None, **train_kw: Any) -> tuple[AlibiResult, list[dict]]:
  """ALIBI with its hyperparameters chosen on a validation split, at no extra privacy cost.

  The noisy labels of every training point are drawn once (`alibi_noisy_labels`, the one
  ε-label-DP release). Each grid point (a dict of `train_alibi` options, e.g. ``lr`` and
  ``iterations``) is trained on the first ``1 - val_fraction`` of a random split and scored by
  its agreement, on the held-out part, with the argmax of those points' noisy-label posterior
  (`alibi_posterior`, uniform prior). Scoring, choosing and retraining the chosen point on all
  points read only the release and the (public) features, so the returned model stays
  ε-label-DP. Ties go to the earlier grid point. Returns the retrained model and one row per
  grid point (its options, ``val_agreement``, ``chosen``).
  """
  if not grid:
    raise ValueError("tune_alibi: the grid is empty.")
  if not 0.0 < val_fraction < 1.0:
    raise ValueError(f"tune_alibi: val_fraction must lie in (0, 1), got {val_fraction}.")
  eps = check_epsilon(epsilon, allow_zero=False)
  key = jax.random.PRNGKey(0) if key is None else key
  k_noise, k_split, k_train = jax.random.split(key, 3)
  noisy = alibi_noisy_labels(k_noise, y, n_classes, eps)
  n = noisy.shape[0]
  order = np.asarray(jax.random.permutation(k_split, n))
  n_val = max(1, int(round(val_fraction * n)))
  tr, va = order[n_val:], order[:n_val]
  xs, ys = np.asarray(x, np.float32), np.asarray(y)
  target = np.argmax(alibi_posterior(noisy[va], eps), 1)
  rows = []
  for point in grid:
    r = train_alibi(apply_fn, init_params, xs[tr], ys[tr], eps, n_classes=n_classes,
                    key=k_train, noisy=noisy[tr], **{**train_kw, **point})
    z = np.asarray(apply_fn(r.params, jnp.asarray(xs[va])))
    pred = (z[:, 0] > 0).astype(int) if z.shape[-1] == 1 else np.argmax(z, -1)
    rows.append({**point, "val_agreement": float(np.mean(pred == target))})
  best = max(range(len(rows)), key=lambda i: (round(rows[i]["val_agreement"], 6), -i))
  for i, row in enumerate(rows):
    row["chosen"] = i == best
  final = train_alibi(apply_fn, init_params, xs, ys, eps, n_classes=n_classes, key=k_train,
                      noisy=noisy, **{**train_kw, **grid[best]})
  return final, rows


# ---------------------------------------------------------------------------------------------
# DP-SGD (Abadi et al. 2016, via boundjax.training.dpsgd)
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class DpSgdResult(_TrainedBaseline):
  """`train_dpsgd_baseline`'s model and account.

  Attributes:
    params: the trained parameters.
    epsilon: the accounted ε at ``delta`` (``<=`` the target).
    delta: the δ of the (ε, δ)-DP guarantee.
    noise_multiplier: the calibrated Gaussian noise multiplier.
    seconds: training time.
    guarantee: ``"(eps, delta)-DP"``.
  """

  params: PyTree = dataclasses.field(repr=False)
  epsilon: float
  delta: float
  noise_multiplier: float
  seconds: float
  guarantee: str = "(eps, delta)-DP"


def train_dpsgd_baseline(apply_fn: ApplyFn, init_params: PyTree, x: Any, y: Any,
                         epsilon: float, *, delta: float | None = None, epochs: int = 5,
                         batch_size: int = 256, lr: float = 0.1, l2_norm_clip: float = 1.0,
                         key: jax.Array | None = None, output: str | None = None
                         ) -> DpSgdResult:
  """DP-SGD at a target ε (noise calibrated with dp-accounting's RDP accountant), LUCID, §7.

  (ε, δ)-DP for all parameters (δ = 1/n by default), hence (ε, δ)-iDP: a weaker guarantee than
  the pure ε of the other mechanisms, as in the paper's comparison (which leaves δ unstated).
  ``key`` (default ``PRNGKey(0)``) seeds the noise and the batches.
  """
  from boundjax.training import dpsgd
  eps = check_epsilon(epsilon, allow_zero=False)
  xs, ys = np.asarray(x, np.float32), np.asarray(y)
  n = xs.shape[0]
  delta = 1.0 / n if delta is None else float(delta)
  n_out = int(apply_fn(init_params, jnp.asarray(xs[:1])).shape[-1])
  kind = output_kind(n_out, output)
  loss = "binary_cross_entropy" if kind == "sign" else "cross_entropy"
  seed = 0 if key is None else _int_seed(key)
  t0 = time.perf_counter()
  res = dpsgd.train(apply_fn, init_params, xs, ys, loss=loss, learning_rate=lr, epochs=epochs,
                    batch_size=batch_size, l2_norm_clip=l2_norm_clip, epsilon=eps, delta=delta,
                    seed=seed)
  return DpSgdResult(res.params, float(res.epsilon), delta, float(res.noise_multiplier),
                     time.perf_counter() - t0)
