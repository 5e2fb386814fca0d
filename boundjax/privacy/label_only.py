"""LUCID's guarded label-only predictor and the baselines of its accuracy comparison.

LUCID (spec 000) answers label-only queries ``f_x(D) = argmax N(x)`` with individual differential
privacy (iDP) for the leave-one-out neighbours ``D \\ {x_D}`` of the training set D:

* **Confidence** (spec §1.4): ``C^c_N(x) = N(x)_c - max_{c' != c} N(x)_{c'}`` for the predicted
  class c (0 on a tie). For a one-output *sign* network (the Sphynx convention of
  `milp.network`: class 1 iff ``z >= 0``) the confidence is ``z`` for class 1 and ``-z`` for class
  0, i.e. ``|z|``.
* **iDP deterministic bound** β_c (spec §1.4, Eq. 1): no input with ``C^c_N(x) >= β_c`` is
  labelled differently by any leave-one-out network. β_c comes from `milp.idpdb` (an input here).
* **LUCID-Inference** (spec §2.10, Alg. 2), `LabelOnlyGuard`: return ``c = argmax N(x)`` without
  noise iff ``C^c_N(x) > β_c`` (strict: ``C = β_c`` is noised); such an answer has local
  sensitivity 0 and is 0-iDP (Thm 6.1). Otherwise answer with the exponential mechanism over the
  one-hot utility ``u(c') = 1[c' = c]`` with ``Δu = 1`` (Lemma 3.2: ε-iDP), and memoise that
  answer so that repeating x cannot average the noise away (bounded memo, oldest evicted).

Ties. A logits network picks the lowest tied index (``argmax``) with confidence 0; a sign network
picks class 1 at ``z = 0`` with confidence 0. A tied input is therefore released without noise
only when ``0 > β_c``, i.e. when the bound certifies that no leave-one-out network disagrees with
c anywhere N's confidence is ``>= β_c`` (which includes the tie). β_c values from a MILP whose
"N's confidence >= β" side includes 0 make this sound.

Baselines (spec §1.5, §4.4; ε-DP implies ε-iDP):

=====================  ==================================================  =================
mechanism              what it does                                        guarantee
=====================  ==================================================  =================
`naive_noise`          exponential mechanism on every query (Δu = 1)       ε-DP (per query)
`naive_idp`            all |D|+1 networks per query, noise on disagreement ε-iDP (per query)
`train_alibi`          ALIBI: Laplace-noised one-hot training labels,      ε-label-DP
                       Bayesian posterior soft labels, model trained on
                       them (Malek et al. 2021)
`train_dpsgd_baseline` DP-SGD (`boundjax.dpsgd`, optax + dp-accounting)    (ε, δ)-DP
=====================  ==================================================  =================

`accuracy_table` compares them at iDP ε ∈ {0, 0.02, 0.2, 1} and DP ε ∈ {0.02, 0.2, 1} (spec
Tables 1–3): accuracy decrease (percentage points against N), fraction of noised queries and the
guard's per-query latency (the paper reports 0.16 ms).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import time
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any
ApplyFn = Callable[[PyTree, jax.Array], jax.Array]

#: ε values of the paper's iDP comparison (Tables 1 and 2) and of its DP baselines (Table 3;
#: DP cannot reach ε = 0, so 0.02 stands in for it).
IDP_EPSILONS: tuple[float, ...] = (0.0, 0.02, 0.2, 1.0)
DP_EPSILONS: tuple[float, ...] = (0.02, 0.2, 1.0)

#: Spec §4.5–4.7, Adult 2×50 (accuracy in %): Table 1 (LUCID), Table 2 (Naive-Noise,
#: Naive-iDP), Table 3 (DP-SGD, ALIBI); and the headline averages over the 11 networks (§4.9).
PAPER_ADULT_2X50 = {
    "acc_no_protection": 83.1,
    "beta": {"0": 0.55, "1": 0.63},
    "LUCID": {"0": 82.4, "0.2": 82.4, "1": 82.5, "latency_ms": 0.1},
    "Naive-Noise": {"0": 49.9, "0.2": 51.7, "1": 58.2},
    "Naive-iDP": {"0": 83.1, "0.2": 82.9, "1": 83.1},
    "DP-SGD": {"0.02": 23.6, "0.2": 76.3, "1": 76.3},
    "ALIBI": {"0.02": 67.4, "0.2": 77.4, "1": 82.2},
}
PAPER_HEADLINE = {"LUCID_decrease": {"0": 1.4, "0.2": 1.3, "1": 1.1},
                  "DP_baselines_decrease": 12.7, "latency_ms": 0.16}


# ---------------------------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------------------------

def _concrete(v: Any) -> bool:
  return not isinstance(v, jax.core.Tracer)


def _check_epsilon(epsilon: Any, allow_zero: bool = True, name: str = "epsilon") -> float:
  try:
    e = float(epsilon)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be a number, got {epsilon!r}.") from None
  if not math.isfinite(e) or e < 0 or (e == 0 and not allow_zero):
    bound = ">= 0" if allow_zero else "> 0"
    raise ValueError(f"{name} must be a finite number {bound}, got {epsilon!r}.")
  return e


# ---------------------------------------------------------------------------------------------
# Exponential mechanism (spec §1.5)
# ---------------------------------------------------------------------------------------------

def exponential_mechanism(key: jax.Array, utilities: Any, epsilon: Any,
                          sensitivity: Any = 1.0) -> jax.Array:
  """Samples ``r`` with ``P(r) ∝ exp(ε u(r) / (2 Δu))`` over the last axis (spec §1.5).

  With the one-hot label utility and ``Δu = 1`` (LUCID's setting), the predicted class is kept
  with probability ``e^{ε/2} / (e^{ε/2} + |C| - 1)``; ``ε = 0`` is uniform and a large ε picks
  the argmax. ε-DP for a utility of sensitivity Δu (Dwork & Roth Thm 3.10), ε-iDP with the local
  sensitivity (Lemma 3.2). Jittable; leading axes of ``utilities`` are independent draws.

  Raises:
    ValueError: (concrete values only) ε < 0 or non-finite, Δu <= 0, NaN utilities.
  """
  u = jnp.asarray(utilities, jnp.float32)
  if _concrete(epsilon):
    _check_epsilon(epsilon)
  if _concrete(sensitivity):
    s = float(sensitivity)
    if not (math.isfinite(s) and s > 0):
      raise ValueError(f"exponential_mechanism: sensitivity must be finite and > 0, got {s}.")
  if _concrete(u) and bool(jnp.any(jnp.isnan(u))):
    raise ValueError("exponential_mechanism: utilities contain NaN.")
  logits = jnp.asarray(epsilon, jnp.float32) * u / (2.0 * jnp.asarray(sensitivity, jnp.float32))
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def exponential_probabilities(utilities: Any, epsilon: float, sensitivity: float = 1.0
                              ) -> np.ndarray:
  """The exact distribution of `exponential_mechanism` (float64 softmax of ``ε u / 2Δu``)."""
  e = _check_epsilon(epsilon)
  u = np.asarray(utilities, np.float64)
  z = e * u / (2.0 * float(sensitivity))
  z = z - z.max(axis=-1, keepdims=True)
  p = np.exp(z)
  return p / p.sum(axis=-1, keepdims=True)


def keep_probability(epsilon: float, n_classes: int) -> float:
  """``P(noised label = predicted) = e^{ε/2} / (e^{ε/2} + |C| - 1)`` (spec §1.5)."""
  e = _check_epsilon(epsilon)
  return math.exp(e / 2) / (math.exp(e / 2) + n_classes - 1)


# ---------------------------------------------------------------------------------------------
# Confidence
# ---------------------------------------------------------------------------------------------

def predict_with_confidence(outputs: Any, output: str = "logits") -> tuple[jax.Array, jax.Array]:
  """``(label, confidence)`` per row of network outputs (spec §1.4).

  ``"logits"``: label ``argmax z`` (lowest index on ties), confidence ``z_c - max_{c' != c} z_c'``
  (the top-1 minus top-2 logit; 0 on ties). ``"sign"``: one output unit, label ``1[z >= 0]``,
  confidence ``z`` for class 1 and ``-z`` for class 0 (= ``|z|``).
  """
  z = jnp.asarray(outputs)
  if output == "sign":
    v = z.reshape(z.shape[0], -1)[:, 0] if z.ndim > 1 else z
    return (v >= 0).astype(jnp.int32), jnp.abs(v)
  if output != "logits":
    raise ValueError(f"output must be 'logits' or 'sign', got {output!r}.")
  top2 = jax.lax.top_k(z, 2)[0]
  return jnp.argmax(z, axis=-1).astype(jnp.int32), top2[..., 0] - top2[..., 1]


def _output_kind(n_out: int, output: str | None) -> str:
  if output is None:
    return "sign" if n_out == 1 else "logits"
  if output not in ("logits", "sign"):
    raise ValueError(f"output must be 'logits', 'sign' or None, got {output!r}.")
  if output == "sign" and n_out != 1:
    raise ValueError(f"output='sign' needs one output unit, the network has {n_out}.")
  if output == "logits" and n_out < 2:
    raise ValueError("output='logits' needs >= 2 output units; one unit is a sign network.")
  return output


def _infer_input_shape(params: PyTree) -> tuple[int, ...] | None:
  """``(d,)`` from a Flax MLP's first Dense kernel, else None."""
  p = params.get("params", params) if isinstance(params, Mapping) else None
  if isinstance(p, Mapping):
    first = p.get("Dense_0")
    if isinstance(first, Mapping) and "kernel" in first and np.ndim(first["kernel"]) == 2:
      return (int(np.shape(first["kernel"])[0]),)
  return None


def validate_betas(betas: Any, n_classes: int) -> np.ndarray:
  """β per class as a float64 array of length ``n_classes``.

  Accepts a sequence or a mapping ``{class: β}`` (keys may be strings, as read from JSON). Every
  β must be finite or ``+inf`` (noise every query of that class); NaN and ``-inf`` are refused
  (an infeasible MILP proves there is no leaking input: pass any finite value below every
  confidence, e.g. ``min(β, 0)``).
  """
  if isinstance(betas, Mapping):
    keys = {int(k): v for k, v in betas.items()}
    missing = [c for c in range(n_classes) if c not in keys]
    extra = [k for k in keys if not 0 <= k < n_classes]
    if missing or extra:
      raise ValueError(f"betas: need exactly one β per class 0..{n_classes - 1}; missing "
                       f"{missing}, unexpected {extra}.")
    b = np.array([float(keys[c]) for c in range(n_classes)], np.float64)
  else:
    b = np.asarray(betas, np.float64).reshape(-1)
    if b.size != n_classes:
      raise ValueError(f"betas: need one β per class ({n_classes}), got {b.size}.")
  bad = np.isnan(b) | (b == -np.inf)
  if bad.any():
    raise ValueError(f"betas: β must be finite or +inf, got {b[bad][0]} for class "
                     f"{int(np.flatnonzero(bad)[0])}.")
  return b


def _check_inputs(x: Any, input_shape: tuple[int, ...], what: str) -> np.ndarray:
  a = np.asarray(x)
  if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
    raise ValueError(f"{what}: inputs must be numeric, got dtype {a.dtype}.")
  if tuple(a.shape[1:]) != tuple(input_shape):
    raise ValueError(f"{what}: expected inputs of shape (n, {', '.join(map(str, input_shape))}), "
                     f"got {a.shape}.")
  a = a.astype(np.float32)
  if not np.all(np.isfinite(a)):
    raise ValueError(f"{what}: inputs contain NaN or Inf (row "
                     f"{int(np.flatnonzero(~np.isfinite(a.reshape(len(a), -1)).all(1))[0])}).")
  return a + np.float32(0.0)   # -0.0 + 0.0 = +0.0: one memo key per value


# ---------------------------------------------------------------------------------------------
# The guard (spec §2.10, Alg. 2)
# ---------------------------------------------------------------------------------------------

class GuardAnswer(NamedTuple):
  """Answers of `LabelOnlyGuard.query_batch`: labels, which were noised, N's confidences."""

  labels: np.ndarray       # (n,) int64
  noised: np.ndarray       # (n,) bool: confidence <= β of the predicted class
  confidence: np.ndarray   # (n,) float32 C^c_N(x) of the predicted class c


@functools.lru_cache(maxsize=32)
def _guard_programs(apply_fn: ApplyFn, kind: str, n_classes: int):
  """Jitted ``decide`` (label, confidence, noised) and ``sample`` (exponential mechanism with
  per-query keys ``fold_in(key, counter)``), shared by every guard of the same network."""

  def decide(p, x, betas):
    label, conf = predict_with_confidence(apply_fn(p, x), kind)
    return label, conf, conf <= betas[label]

  def sample(base_key, counters, labels, eps):
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(base_key, counters)
    u = jax.nn.one_hot(labels, n_classes, dtype=jnp.float32)
    return jax.vmap(exponential_mechanism, in_axes=(0, 0, None))(keys, u, eps)

  return jax.jit(decide), jax.jit(sample)


class LabelOnlyGuard:
  """LUCID-Inference (spec §2.10, Alg. 2): label-only access to N with ε-iDP per query.

  ``query(x)``: if x was answered with noise before, return the memoised label. Otherwise compute
  ``c = argmax N(x)`` and its confidence; return c when ``C^c_N(x) > β_c`` (0-iDP, no randomness
  consumed); else draw the exponential-mechanism label (utility ``1[c' = c]``, Δu = 1, ε-iDP),
  memoise it and return it.

  Args:
    apply_fn: ``apply_fn(params, x)`` -> outputs of shape ``(n, |C|)`` (logits) or ``(n, 1)``
      (a sign network: class 1 iff ``z >= 0``).
    params: N's parameters.
    betas: β per class (sequence or ``{class: β}``), see `validate_betas`. Any value ≥ the true
      iDP-DB is sound; larger values only add noise.
    epsilon: the iDP budget of a noised answer (``ε >= 0``; 0 = uniform label).
    seed: seeds the noise (``jax.random.PRNGKey(seed)``; the public code uses 42).
    memo_size: the memo's capacity (noised answers kept; the oldest is evicted when full). The
      paper assumes the defender remembers as much as the attacker; an evicted input answered
      again gets fresh noise.
    input_shape: one input's shape; inferred from a Flax MLP's parameters when omitted.
    output: ``"logits"``, ``"sign"`` or None (by the number of outputs).

  The memo key is the input's float32 bytes (with ``-0.0`` folded into ``0.0``); inputs that
  differ in any bit are distinct queries, each ε-iDP on its own. `epsilon_spent` reports the
  sequential-composition total ``k ε`` over the k distinct noised answers (an optional account;
  the paper gives none, spec §1.5).
  """

  def __init__(self, apply_fn: ApplyFn, params: PyTree, betas: Any, epsilon: float, *,
               seed: int = 42, memo_size: int = 1_000_000,
               input_shape: Sequence[int] | None = None, output: str | None = None):
    self.epsilon = _check_epsilon(epsilon)
    if not isinstance(memo_size, (int, np.integer)) or memo_size < 1:
      raise ValueError(f"LabelOnlyGuard: memo_size must be an integer >= 1, got {memo_size!r}.")
    shape = tuple(int(s) for s in input_shape) if input_shape is not None else \
        _infer_input_shape(params)
    if shape is None:
      raise ValueError("LabelOnlyGuard: cannot infer the input shape from params; pass "
                       "input_shape=(d,).")
    self.input_shape = shape
    self.params = params
    n_out = int(np.shape(jax.eval_shape(apply_fn, params,
                                        jax.ShapeDtypeStruct((1,) + shape, jnp.float32)))[-1])
    self.output = _output_kind(n_out, output)
    self.n_classes = 2 if self.output == "sign" else n_out
    self.betas = validate_betas(betas, self.n_classes)
    self._betas_f32 = jnp.asarray(self.betas, jnp.float32)
    self.memo_size = int(memo_size)
    self.memo: collections.OrderedDict[bytes, int] = collections.OrderedDict()
    self._key = jax.random.PRNGKey(seed)
    self._draws = 0
    self.noised_answers = 0    # fresh exponential-mechanism draws (memo misses)
    self._decide, self._sample = _guard_programs(apply_fn, self.output, self.n_classes)

  @property
  def epsilon_spent(self) -> float:
    """``k ε`` for the k distinct noised answers so far (sequential composition, spec §1.5)."""
    return self.noised_answers * self.epsilon

  def reset(self) -> None:
    """Forgets the memo (the noise stream continues)."""
    self.memo.clear()

  def query(self, x: Any) -> int:
    """One label (spec Alg. 2 ``Access``)."""
    a = np.asarray(x)
    return int(self.query_batch(a[None]).labels[0])

  __call__ = query

  def query_batch(self, x: Any) -> GuardAnswer:
    """Answers a batch, row by row as `query` would (duplicate rows share one noised answer).

    Returns:
      `GuardAnswer` ``(labels, noised, confidence)``; ``noised`` is exactly ``confidence <=
      β[argmax]``, memoised answers included.
    """
    xs = _check_inputs(x, self.input_shape, "LabelOnlyGuard.query_batch")
    label, conf, noised = (np.asarray(v) for v in self._decide(self.params, jnp.asarray(xs),
                                                                 self._betas_f32))
    labels = label.astype(np.int64)
    rows = np.flatnonzero(noised)
    if rows.size:
      flat = xs.reshape(len(xs), -1)
      keys_b = [flat[i].tobytes() for i in rows]
      fresh = [i for i, k in zip(rows, keys_b) if k not in self.memo]
      drawn = {}
      if fresh:
        counters = np.arange(self._draws, self._draws + len(fresh), dtype=np.uint32)
        self._draws += len(fresh)
        drawn = dict(zip(fresh, np.asarray(self._sample(self._key, counters, label[fresh],
                                                        np.float32(self.epsilon))).tolist()))
      for i, k in zip(rows, keys_b):
        if k in self.memo:
          labels[i] = self.memo[k]
          continue
        labels[i] = drawn[i]
        self.memo[k] = int(drawn[i])
        self.noised_answers += 1
        if len(self.memo) > self.memo_size:
          self.memo.popitem(last=False)
    return GuardAnswer(labels, noised.astype(bool), conf.astype(np.float32))


# ---------------------------------------------------------------------------------------------
# Naive baselines (spec §1.5, §3.3)
# ---------------------------------------------------------------------------------------------

def _outputs_kind(apply_fn: ApplyFn, params: PyTree, x: Any, output: str | None):
  z = apply_fn(params, jnp.asarray(x, jnp.float32))
  return z, _output_kind(int(z.shape[-1]), output)


def naive_noise(key: jax.Array, apply_fn: ApplyFn, params: PyTree, x: Any, epsilon: float,
                output: str | None = None) -> np.ndarray:
  """Naive-Noise: the exponential mechanism on every query (Δu = 1 = the global sensitivity).

  ε-DP per query (hence ε-iDP). Keeps N's label with probability ``e^{ε/2} / (e^{ε/2} + |C| -
  1)``: 0.5 / 0.5025 / 0.525 / 0.622 for two classes at ε = 0 / 0.02 / 0.2 / 1 (spec §1.5).
  """
  eps = _check_epsilon(epsilon)
  z, kind = _outputs_kind(apply_fn, params, x, output)
  label, _ = predict_with_confidence(z, kind)
  k = 2 if kind == "sign" else int(z.shape[-1])
  keys = jax.random.split(key, label.shape[0])
  u = jax.nn.one_hot(label, k, dtype=jnp.float32)
  return np.asarray(jax.vmap(exponential_mechanism, in_axes=(0, 0, None))(keys, u, eps),
                    np.int64)


def naive_idp(key: jax.Array, apply_fn: ApplyFn, params: PyTree, members: PyTree, x: Any,
              epsilon: float, output: str | None = None, chunk: int = 2048
              ) -> tuple[np.ndarray, np.ndarray]:
  """Naive-iDP: run every query through N and all leave-one-out networks (vmapped over
  ``members``, a parameter tree with a leading member axis); return N's label when all agree,
  else the exponential-mechanism label (spec §1.5).

  ε-iDP per query when ``members`` is the whole leave-one-out family of D (the exact leaking set,
  the least noise possible); with only part of the family it guarantees nothing. Inputs go
  through the members ``chunk`` at a time (memory ``members x chunk x width``). Returns
  ``(labels, noised)``.
  """
  eps = _check_epsilon(epsilon)
  xs = jnp.asarray(x, jnp.float32)
  z, kind = _outputs_kind(apply_fn, params, xs, output)
  label, _ = predict_with_confidence(z, kind)
  def disagree(xb, lb):
    zm = jax.vmap(apply_fn, in_axes=(0, None))(members, xb)
    ml = jax.vmap(lambda o: predict_with_confidence(o, kind)[0])(zm)
    return jnp.any(ml != lb[None], axis=0)

  noised = jnp.concatenate([disagree(xs[i:i + chunk], label[i:i + chunk])
                            for i in range(0, xs.shape[0], chunk)])
  k = 2 if kind == "sign" else int(z.shape[-1])
  keys = jax.random.split(key, label.shape[0])
  u = jax.nn.one_hot(label, k, dtype=jnp.float32)
  drawn = jax.vmap(exponential_mechanism, in_axes=(0, 0, None))(keys, u, eps)
  return np.asarray(jnp.where(noised, drawn, label), np.int64), np.asarray(noised)


# ---------------------------------------------------------------------------------------------
# ALIBI (label DP; Malek et al. 2021, spec §4.4)
# ---------------------------------------------------------------------------------------------

def alibi_noisy_labels(key: jax.Array, y: Any, n_classes: int, epsilon: float) -> np.ndarray:
  """ALIBI's randomised response: ``o = onehot(y) + Lap(λ)^{|C|}``, ``λ = 2 / ε``.

  The one-hot vector has L1 sensitivity 2 under a change of one label, so releasing ``o`` is
  ε-label-DP (Laplace mechanism); everything computed from ``o`` (the posterior, the trained
  model) inherits it. Returns ``(n, |C|)`` float64.
  """
  eps = _check_epsilon(epsilon, allow_zero=False)
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
  eps = _check_epsilon(epsilon, allow_zero=False)
  o = np.asarray(noisy, np.float64)
  lam = 2.0 / eps
  logits = (np.abs(o) - np.abs(o - 1.0)) / lam
  if prior is not None:
    p = np.broadcast_to(np.asarray(prior, np.float64), o.shape)
    logits = logits + np.log(np.maximum(p, 1e-300))
  logits -= logits.max(axis=1, keepdims=True)
  w = np.exp(logits)
  return w / w.sum(axis=1, keepdims=True)


def alibi_label_flip_probability(epsilon: float, n_classes: int = 2, samples: int = 0) -> float:
  """P(the posterior's argmax label differs from the true label), uniform prior.

  Two classes: the MAP label is wrong when ``g(o_wrong) > g(o_true)``, ``g(t) = |t| - |t - 1|``
  (clipped ramp), half the time on a tie; computed by numerical integration over the Laplace
  densities (exact up to quadrature error). Used to check the noise in tests.
  """
  eps = _check_epsilon(epsilon, allow_zero=False)
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
                      seed: int = 0, output: str | None = None) -> PyTree:
  """SGD on soft labels ``(n, |C|)`` with `boundjax.ensembles.train_single` (LUCID's optimiser)."""
  from boundjax import ensembles as E
  n_out = int(apply_fn(init_params, jnp.asarray(np.asarray(x)[:1], jnp.float32)).shape[-1])
  kind = _output_kind(n_out, output)
  return E.train_single(apply_fn, init_params, E.sgd(lr, weight_decay=weight_decay),
                        np.asarray(x, np.float32), np.asarray(soft, np.float32), epochs=epochs,
                        batch_size=batch_size, seed=seed, loss_fn=_soft_ce(kind))


def train_alibi(apply_fn: ApplyFn, init_params: PyTree, x: Any, y: Any, epsilon: float, *,
                n_classes: int = 2, epochs: int = 30, batch_size: int = 1024, lr: float = 0.1,
                weight_decay: float = 1e-5, iterations: int = 1, seed: int = 0,
                output: str | None = None) -> tuple[PyTree, dict]:
  """ALIBI (Malek et al. 2021; spec §4.4): ε-label-DP training.

  1. `alibi_noisy_labels`: ``o_i = onehot(y_i) + Lap(2/ε)`` (the only access to the labels);
  2. `alibi_posterior` with a uniform prior (post-processing);
  3. train on the soft labels (`train_soft_labels`); with ``iterations > 1`` the model's softmax
     on the training inputs becomes each example's prior and the model is retrained from the same
     initial parameters (ALIBI's iterative Bayesian inference; features are public under label
     DP, so this stays post-processing).

  The guarantee is ε-DP with respect to the training labels (label DP), hence ε-iDP for label
  changes; it does not protect the features. Returns ``(params, info)``.
  """
  eps = _check_epsilon(epsilon, allow_zero=False)
  if iterations < 1:
    raise ValueError(f"train_alibi: iterations must be >= 1, got {iterations}.")
  t0 = time.perf_counter()
  noisy = alibi_noisy_labels(jax.random.PRNGKey(seed), y, n_classes, eps)
  soft = alibi_posterior(noisy, eps)          # first round: uniform prior, as ALIBI starts
  params = init_params
  for it in range(iterations):
    params = train_soft_labels(apply_fn, init_params, x, soft, epochs=epochs,
                               batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                               seed=seed, output=output)
    if it + 1 < iterations:
      z = apply_fn(params, jnp.asarray(x, jnp.float32))
      if z.shape[-1] == 1:
        p1 = np.asarray(jax.nn.sigmoid(z[:, 0]), np.float64)
        model_prior = np.stack([1 - p1, p1], axis=1)
      else:
        model_prior = np.asarray(jax.nn.softmax(z, axis=-1), np.float64)
      soft = alibi_posterior(noisy, eps, np.clip(model_prior, 1e-6, 1.0))
  agree = float(np.mean(np.argmax(soft, 1) == np.asarray(y)))
  return params, {"epsilon": eps, "guarantee": "eps-label-DP", "lambda": 2.0 / eps,
                  "posterior_label_agreement": agree, "iterations": iterations,
                  "seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------------------------------------
# DP-SGD (Abadi et al. 2016, via boundjax.dpsgd)
# ---------------------------------------------------------------------------------------------

def train_dpsgd_baseline(apply_fn: ApplyFn, init_params: PyTree, x: Any, y: Any,
                         epsilon: float, *, delta: float | None = None, epochs: int = 5,
                         batch_size: int = 256, lr: float = 0.1, l2_norm_clip: float = 1.0,
                         seed: int = 0, output: str | None = None) -> tuple[PyTree, dict]:
  """DP-SGD at a target ε (noise calibrated with dp-accounting's RDP accountant), spec §4.4.

  (ε, δ)-DP for all parameters (δ = 1/n by default), hence (ε, δ)-iDP: a weaker guarantee than
  the pure ε of the other mechanisms, as in the paper's comparison (which leaves δ unstated).
  Returns ``(params, info)`` with the noise multiplier and the accounted ε.
  """
  from boundjax import dpsgd
  eps = _check_epsilon(epsilon, allow_zero=False)
  xs, ys = np.asarray(x, np.float32), np.asarray(y)
  n = xs.shape[0]
  delta = 1.0 / n if delta is None else float(delta)
  n_out = int(apply_fn(init_params, jnp.asarray(xs[:1])).shape[-1])
  kind = _output_kind(n_out, output)
  loss = "binary_cross_entropy" if kind == "sign" else "cross_entropy"
  t0 = time.perf_counter()
  params, got_eps, sigma = dpsgd.train_dpsgd(apply_fn, init_params, xs, ys, loss=loss,
                                             learning_rate=lr, epochs=epochs,
                                             batch_size=batch_size, l2_norm_clip=l2_norm_clip,
                                             target_eps=eps, delta=delta, seed=seed)
  return params, {"epsilon": got_eps, "delta": delta, "noise_multiplier": sigma,
                  "guarantee": "(eps, delta)-DP", "seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------------------------------------
# Accuracy comparison (spec Tables 1–3)
# ---------------------------------------------------------------------------------------------

def _accuracy(labels: np.ndarray, y: np.ndarray) -> float:
  return float(np.mean(np.asarray(labels) == np.asarray(y)))


def guard_latency(guard: LabelOnlyGuard, x: Any, n: int = 200) -> dict:
  """Per-query latency of ``guard.query`` in ms: mean, median, max.

  Both paths (released and noised) are compiled first by throw-away guards that share the
  guard's programs, so no compilation is timed. The guard's memo fills as a side effect.
  """
  xs = np.asarray(x)[:n]
  for b in (math.inf, -1e30):
    warm = LabelOnlyGuard.__new__(LabelOnlyGuard)
    warm.__dict__.update(guard.__dict__)
    warm.memo, warm.betas = collections.OrderedDict(), np.full(guard.n_classes, b)
    warm._betas_f32 = jnp.asarray(warm.betas, jnp.float32)
    warm.query(xs[0])
  times = []
  for row in xs:
    t = time.perf_counter()
    guard.query(row)
    times.append(time.perf_counter() - t)
  t_ms = np.asarray(times) * 1e3
  return {"mean_ms": float(t_ms.mean()), "median_ms": float(np.median(t_ms)),
          "max_ms": float(t_ms.max()), "queries": int(t_ms.size)}


_GUARANTEES = {"DP-SGD": "(eps, delta)-DP", "ALIBI": "eps-label-DP"}


def accuracy_table(apply_fn: ApplyFn, params: PyTree, betas: Any, x: Any, y: Any, *,
                   idp_epsilons: Sequence[float] = IDP_EPSILONS,
                   dp_epsilons: Sequence[float] = DP_EPSILONS,
                   members: PyTree | None = None,
                   trained: Mapping[str, Mapping[float, tuple[ApplyFn, PyTree]]] | None = None,
                   repeats: int = 10, seed: int = 0, latency_queries: int = 200,
                   input_shape: Sequence[int] | None = None, output: str | None = None) -> dict:
  """Accuracy decrease of each mechanism against N on ``(x, y)`` (spec Tables 1–3).

  Rows (accuracy decrease = N's accuracy − the mechanism's, in percentage points; negative means
  better than N):

  * ``LUCID`` (the guard, ε-iDP) and ``Naive-Noise`` (ε-DP) at every ε of ``idp_epsilons``,
    averaged over ``repeats`` noise draws (fresh guard and memo per draw), with the exact
    expected accuracy beside the empirical mean, and the fraction of noised queries;
  * ``Naive-iDP`` (ε-iDP; only when ``members``, the leave-one-out family, is given);
  * every model in ``trained`` (``{"DP-SGD": {ε: (apply_fn, params)}, "ALIBI": ...}``), DP
    models trained at ``dp_epsilons`` (their noise is in the training; one evaluation each).

  Also the guard's per-query latency (`guard_latency`) and N's accuracy.
  """
  xs, yy = np.asarray(x, np.float32), np.asarray(y, np.int64)
  if xs.shape[0] != yy.shape[0]:
    raise ValueError(f"accuracy_table: {xs.shape[0]} inputs but {yy.shape[0]} labels.")
  if repeats < 1:
    raise ValueError(f"accuracy_table: repeats must be >= 1, got {repeats}.")
  z, kind = _outputs_kind(apply_fn, params, xs, output)
  pred, conf = (np.asarray(v) for v in predict_with_confidence(z, kind))
  k = 2 if kind == "sign" else int(z.shape[-1])
  base = _accuracy(pred, yy)
  correct = pred == yy
  rows = []

  def row(name, guarantee, eps, accs, expected=None, noised=None, extra=None):
    accs = np.asarray(accs, np.float64)
    r = {"mechanism": name, "guarantee": guarantee, "epsilon": float(eps),
         "accuracy": float(accs.mean()), "accuracy_std": float(accs.std()),
         "decrease_pp": 100.0 * (base - float(accs.mean())), "repeats": int(accs.size)}
    if expected is not None:
      r["expected_accuracy"] = float(expected)
    if noised is not None:
      r["noised_fraction"] = float(noised)
    r.update(extra or {})
    rows.append(r)

  latency = None
  for eps in idp_epsilons:
    keep = keep_probability(eps, k)
    accs, frac = [], None
    for r in range(repeats):
      g = LabelOnlyGuard(apply_fn, params, betas, eps, seed=seed + r, input_shape=(
          input_shape or xs.shape[1:]), output=output)
      ans = g.query_batch(xs)
      accs.append(_accuracy(ans.labels, yy))
      frac = float(ans.noised.mean())
      noised_mask = ans.noised
    expected = np.mean(np.where(noised_mask, np.where(correct, keep, (1 - keep) / (k - 1)),
                                correct))
    row("LUCID", "eps-iDP", eps, accs, expected, frac)
    nn_accs = [_accuracy(naive_noise(jax.random.PRNGKey(seed + 1000 + r), apply_fn, params, xs,
                                     eps, output), yy) for r in range(repeats)]
    row("Naive-Noise", "eps-DP", eps, nn_accs,
        np.mean(np.where(correct, keep, (1 - keep) / (k - 1))), 1.0)
    if members is not None:
      res = [naive_idp(jax.random.PRNGKey(seed + 2000 + r), apply_fn, params, members, xs, eps,
                       output) for r in range(repeats)]
      row("Naive-iDP", "eps-iDP", eps, [_accuracy(l, yy) for l, _ in res], None,
          float(res[0][1].mean()))
  g = LabelOnlyGuard(apply_fn, params, betas, 0.0, seed=seed,
                     input_shape=input_shape or xs.shape[1:], output=output)
  latency = guard_latency(g, xs, latency_queries)
  t = time.perf_counter()
  LabelOnlyGuard(apply_fn, params, betas, 0.0, seed=seed, input_shape=input_shape or xs.shape[1:],
                 output=output).query_batch(xs)
  batch_us = 1e6 * (time.perf_counter() - t) / max(len(xs), 1)
  for name, by_eps in (trained or {}).items():
    for eps in sorted(by_eps):
      fn, p = by_eps[eps]
      zz, kk = _outputs_kind(fn, p, xs, output)
      row(name, _GUARANTEES.get(name, "eps-DP"), eps,
          [_accuracy(np.asarray(predict_with_confidence(zz, kk)[0]), yy)])
  return {"acc_no_protection": base, "n_test": int(len(yy)), "n_classes": k,
          "betas": [float(b) for b in validate_betas(betas, k)], "rows": rows,
          "latency": latency, "batch_us_per_query": batch_us,
          "idp_epsilons": list(map(float, idp_epsilons)),
          "dp_epsilons": list(map(float, dp_epsilons))}


def format_table(result: Mapping) -> str:
  """A plain-text table of `accuracy_table`'s rows."""
  head = ("mechanism", "guarantee", "eps", "acc %", "decrease pp", "noised %")
  lines = [f"N without protection: {100 * result['acc_no_protection']:.2f}% on "
           f"{result['n_test']} test inputs; beta = {result['betas']}"]
  rows = [head]
  for r in result["rows"]:
    rows.append((r["mechanism"], r["guarantee"], f"{r['epsilon']:g}",
                 f"{100 * r['accuracy']:.2f}", f"{r['decrease_pp']:+.2f}",
                 "-" if "noised_fraction" not in r else f"{100 * r['noised_fraction']:.1f}"))
  w = [max(len(str(r[i])) for r in rows) for i in range(len(head))]
  lines += ["  ".join(str(c).ljust(wi) for c, wi in zip(r, w)).rstrip() for r in rows]
  lat = result.get("latency")
  if lat:
    lines.append(f"guard latency: {lat['mean_ms']:.3f} ms/query mean, {lat['max_ms']:.3f} ms max "
                 f"(single queries); {result['batch_us_per_query']:.2f} us/query in one batch")
  return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# β per class for a small family (sound per-member MILPs; milp.idpdb for the real thing)
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class MemberBetas:
  """β per class from per-member MILPs (`per_member_betas`).

  Attributes:
    betas: ``{class: β}``; sound upper bounds (dual bounds plus ``slack``), finite or +inf.
    per_member: ``(members, classes)`` dual bounds (``-inf``: the member can never disagree).
    proven: every MILP finished (optimal or infeasible); otherwise some β is a time-out's dual
      bound (still sound, maybe loose).
    seconds: total solve time.
  """

  betas: dict[int, float]
  per_member: np.ndarray
  proven: bool
  seconds: float
  n_milps: int


def _per_member_bound(net, member, label: int, cfg) -> tuple[float, bool]:
  """``max C^label_N(x)`` over ``x ∈ [0,1]^d`` with ``member`` not predicting ``label``.

  One MILP per competing class ``o`` of the member: maximise ``t`` subject to ``t <= z_label -
  z_c'`` for every ``c' != label`` (N's confidence) and ``z#_label - z#_o <= 0`` (the member does
  not pick ``label``; ties count as disagreement, conservatively). Returns the max of the dual
  bounds and whether every solve was proven.
  """
  from milp.encode import Encoding
  from milp.neighbourhoods import Neighbourhood
  from milp.solve import solve
  d = net.input_size
  lo, hi = np.zeros(d), np.ones(d)
  nb = Neighbourhood(np.full(d, 0.5), lo, hi)
  k = net.num_classes
  others = [0] if net.output == "sign" else [o for o in range(k) if o != label]
  best, proven = -math.inf, True
  for o in others:
    enc = Encoding()
    x = enc.add_input(nb)
    nv = enc.add_network(net, x, lo, hi)
    mv = enc.add_network(member, x, lo, hi)
    ids, co = enc.margin_terms(member, mv, label, None if member.output == "sign" else o)
    enc.add_rows(np.zeros(len(ids)), ids, co, [-np.inf], [0.0])
    t = enc.add_variables([-1e9], [1e9])
    comps = [None] if net.output == "sign" else [c for c in range(k) if c != label]
    for c in comps:
      nids, nco = enc.margin_terms(net, nv, label, c)
      enc.add_rows(np.zeros(len(nids) + 1), np.concatenate([t, nids]),
                   np.concatenate([[1.0], -nco]), [-np.inf], [0.0])
    enc.set_objective(t, [1.0], maximize=True)
    out = solve(enc, cfg)
    proven &= out.proven
    bound = out.dual_bound if not math.isnan(out.dual_bound) else math.inf
    best = max(best, bound)
  return best, proven


def per_member_betas(params: PyTree, members: PyTree, *, classes: Sequence[int] | None = None,
                     time_limit: float = 30.0, slack: float = 1e-4, output: str | None = None,
                     solver: str = "highs", progress: bool = False) -> MemberBetas:
  """Sound β per class by one MILP per (member, class) (spec §2.2 "per-point MILPs").

  ``β_c = max_members max_x {C^c_N(x) : member does not predict c}`` over ``x ∈ [0,1]^d`` (the
  naive decomposition of spec §1.4), solved exactly on small networks with `milp` (HiGHS by
  default: several times faster than SCIP on these two-copy models). Each
  value is a solver *dual bound*, so it is sound even at a time-out; ``slack`` (absolute, plus
  the same relative) is added to cover the solver's feasibility tolerance and the guard's float32
  forward pass. A class no member can disagree on gets ``min over x of nothing = -inf``, reported
  as 0.0 (sound: any β above the true bound is). Exponential in the network size and linear in
  the family: for tiny families (tests, demo); `milp.idpdb` is the scalable method.

  Args:
    params: N's Flax MLP parameters; members: the leave-one-out family, stacked (leading axis).
  """
  from milp.network import from_params, stack_members
  from milp.solve import SolveConfig
  net = from_params(params, output)
  nets = stack_members(members, output)
  cls = list(range(net.num_classes)) if classes is None else [int(c) for c in classes]
  cfg = SolveConfig(solver=solver, time_limit=time_limit)
  t0 = time.perf_counter()
  table = np.full((len(nets), len(cls)), -np.inf)
  proven = True
  from tqdm.auto import tqdm
  for i, m in enumerate(tqdm(nets, desc="per-member MILPs", disable=not progress, leave=False)):
    for j, c in enumerate(cls):
      table[i, j], ok = _per_member_bound(net, m, c, cfg)
      proven &= ok
  betas = {c: guard_beta(float(table[:, j].max()) if len(nets) else -math.inf, slack)
           for j, c in enumerate(cls)}
  return MemberBetas(betas, table, bool(proven), time.perf_counter() - t0,
                     len(nets) * len(cls) * (1 if net.output == "sign" else net.num_classes - 1))


def guard_beta(beta: float, slack: float = 1e-4) -> float:
  """A solver's β made safe for the guard: ``β + slack (1 + |β|)`` for finite β (covers the
  solver's tolerances and the guard's float32 forward pass), ``+inf`` for NaN or ``+inf`` (noise
  everything: sound), and ``0.0`` for ``-inf`` (no member can ever disagree; 0 keeps ties
  noised)."""
  b = float(beta)
  if math.isnan(b) or b == math.inf:
    return math.inf
  if b == -math.inf:
    return 0.0
  return b + slack * (1.0 + abs(b))


def compute_betas(params: PyTree, members: PyTree, *, method: str = "auto",
                  time_limit: float | None = None, node_time_limit: float | None = 60.0,
                  slack: float = 1e-4, screen: bool = False, progress: bool = False
                  ) -> tuple[dict[int, float], dict]:
  """β per class for N (Flax MLP ``params``) and its leave-one-out family (stacked ``members``).

  ``method``: ``"idpdb"`` (`milp.idpdb.betas`, LUCID's branch-and-bound with matching
  dependencies and relax-if-similar), ``"per_member"`` (`per_member_betas`), or ``"auto"``
  (idpdb when importable); with ``screen=True`` idpdb first bounds every member alone by its
  difference intervals (`milp.idpdb.member_bounds`; the choice for large families, e.g. all
  32k leave-one-out networks of Adult). Every value is a sound upper bound (a dual bound),
  passed through `guard_beta`. β is sound for *this* family: the guard is iDP for D only if
  ``members`` holds every leave-one-out network of D. Returns ``(betas, info)``.
  """
  if method not in ("auto", "idpdb", "per_member"):
    raise ValueError(f"compute_betas: method must be 'auto', 'idpdb' or 'per_member', "
                     f"got {method!r}.")
  t0 = time.perf_counter()
  if method in ("auto", "idpdb"):
    try:
      from milp import idpdb
    except ImportError:
      if method == "idpdb":
        raise
      idpdb = None
    if idpdb is not None:
      cfg = idpdb.IdpDbConfig(node_time_limit=node_time_limit, total_time_limit=time_limit,
                              screen=screen)
      res = idpdb.betas(None, params, members, cfg, progress=progress)
      betas = {c: guard_beta(r.beta, slack) for c, r in res.items()}
      return betas, {"method": "milp.idpdb.lucid_compute", "raw": {c: float(r.beta)
                                                                 for c, r in res.items()},
                     "exact": {c: bool(r.exact) for c, r in res.items()},
                     "n_milps": int(sum(r.n_milps for r in res.values())),
                     "seconds": time.perf_counter() - t0}
  res = per_member_betas(params, members, time_limit=node_time_limit or 30.0, slack=slack,
                         progress=progress)
  return res.betas, {"method": "per-member MILPs", "raw": {
      c: float(res.per_member[:, j].max()) for j, c in enumerate(res.betas)},
      "exact": {c: res.proven for c in res.betas}, "n_milps": res.n_milps,
      "seconds": time.perf_counter() - t0}
