"""Label mechanisms of LUCID's guarded predictor: the exponential mechanism over labels and the
confidence of a network's prediction (LUCID, §3.3 and §4).

* `exponential_mechanism` — ``P(r) ∝ exp(ε u(r) / (2 Δu))`` (Dwork & Roth, Thm 3.10),
  jittable; `exponential_probabilities` is its exact distribution and `keep_probability` the
  chance that the one-hot utility keeps the predicted label, ``e^{ε/2} / (e^{ε/2} + |C| - 1)``.
* `predict_with_confidence` — ``(label, C^c_N(x))`` per row of network outputs, with
  ``C^c_N(x) = N(x)_c - max_{c' != c} N(x)_{c'}`` for logits and ``|z|`` for a one-output sign
  network (class 1 iff ``z >= 0``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

OUTPUT_KINDS = ("logits", "sign")


def is_concrete(v: Any) -> bool:
  """True unless ``v`` is a JAX tracer (validation runs only on concrete values)."""
  return not isinstance(v, jax.core.Tracer)


def check_epsilon(epsilon: Any, allow_zero: bool = True, name: str = "epsilon") -> float:
  """``epsilon`` as a float; raises ``ValueError`` unless it is finite and ``>= 0`` (``> 0``
  when ``allow_zero`` is False)."""
  try:
    e = float(epsilon)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be a number, got {epsilon!r}.") from None
  if not math.isfinite(e) or e < 0 or (e == 0 and not allow_zero):
    bound = ">= 0" if allow_zero else "> 0"
    raise ValueError(f"{name} must be a finite number {bound}, got {epsilon!r}.")
  return e


# ---------------------------------------------------------------------------------------------
# Exponential mechanism (LUCID, §3.3, Lemma 3.2)
# ---------------------------------------------------------------------------------------------

def exponential_mechanism(key: jax.Array, utilities: Any, epsilon: Any,
                          sensitivity: Any = 1.0) -> jax.Array:
  """Samples ``r`` with ``P(r) ∝ exp(ε u(r) / (2 Δu))`` over the last axis (LUCID, §3.3).

  With the one-hot label utility and ``Δu = 1`` (LUCID's setting), the predicted class is kept
  with probability ``e^{ε/2} / (e^{ε/2} + |C| - 1)``; ``ε = 0`` is uniform and a large ε picks
  the argmax. ε-DP for a utility of sensitivity Δu (Dwork & Roth Thm 3.10), ε-iDP with the local
  sensitivity (LUCID Lemma 3.2). Jittable; leading axes of ``utilities`` are independent draws.

  Raises:
    ValueError: (concrete values only) ε < 0 or non-finite, Δu <= 0, NaN utilities.
  """
  u = jnp.asarray(utilities, jnp.float32)
  if is_concrete(epsilon):
    check_epsilon(epsilon)
  if is_concrete(sensitivity):
    s = float(sensitivity)
    if not (math.isfinite(s) and s > 0):
      raise ValueError(f"exponential_mechanism: sensitivity must be finite and > 0, got {s}.")
  if is_concrete(u) and bool(jnp.any(jnp.isnan(u))):
    raise ValueError("exponential_mechanism: utilities contain NaN.")
  logits = jnp.asarray(epsilon, jnp.float32) * u / (2.0 * jnp.asarray(sensitivity, jnp.float32))
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def exponential_probabilities(utilities: Any, epsilon: float, sensitivity: float = 1.0
                              ) -> np.ndarray:
  """The exact distribution of `exponential_mechanism` (float64 softmax of ``ε u / 2Δu``)."""
  e = check_epsilon(epsilon)
  u = np.asarray(utilities, np.float64)
  z = e * u / (2.0 * float(sensitivity))
  z = z - z.max(axis=-1, keepdims=True)
  p = np.exp(z)
  return p / p.sum(axis=-1, keepdims=True)


def keep_probability(epsilon: float, n_classes: int) -> float:
  """``P(noised label = predicted) = e^{ε/2} / (e^{ε/2} + |C| - 1)`` (LUCID, §3.3)."""
  e = check_epsilon(epsilon)
  return math.exp(e / 2) / (math.exp(e / 2) + n_classes - 1)


def one_hot_mechanism(key: jax.Array, labels: jax.Array, n_classes: int, epsilon: Any
                      ) -> jax.Array:
  """`exponential_mechanism` with the one-hot utility ``u(c') = 1[c' = label]`` (Δu = 1), one
  independent draw per label (``key`` is split per row)."""
  keys = jax.random.split(key, labels.shape[0])
  u = jax.nn.one_hot(labels, n_classes, dtype=jnp.float32)
  return jax.vmap(exponential_mechanism, in_axes=(0, 0, None))(keys, u, epsilon)


# ---------------------------------------------------------------------------------------------
# Confidence (LUCID, §4)
# ---------------------------------------------------------------------------------------------

@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Prediction:
  """`predict_with_confidence`'s result (a pytree: usable inside ``jit``).

  Attributes:
    label: ``(n,)`` int32 predicted classes.
    confidence: ``(n,)`` the confidence ``C^c_N(x)`` of the predicted class c.
  """

  label: jax.Array
  confidence: jax.Array


def predict_with_confidence(outputs: Any, output: str = "logits") -> Prediction:
  """Label and confidence per row of network outputs (LUCID, §4).

  ``"logits"``: label ``argmax z`` (lowest index on ties), confidence ``z_c - max_{c' != c} z_c'``
  (the top-1 minus top-2 logit; 0 on ties). ``"sign"``: one output unit, label ``1[z >= 0]``,
  confidence ``z`` for class 1 and ``-z`` for class 0 (= ``|z|``).
  """
  z = jnp.asarray(outputs)
  if output == "sign":
    v = z.reshape(z.shape[0], -1)[:, 0] if z.ndim > 1 else z
    return Prediction((v >= 0).astype(jnp.int32), jnp.abs(v))
  if output != "logits":
    raise ValueError(f"output must be 'logits' or 'sign', got {output!r}.")
  top2 = jax.lax.top_k(z, 2)[0]
  return Prediction(jnp.argmax(z, axis=-1).astype(jnp.int32), top2[..., 0] - top2[..., 1])


def output_kind(n_out: int, output: str | None) -> str:
  """``"logits"`` or ``"sign"`` for a network with ``n_out`` outputs (``None``: sign iff one
  output); raises ``ValueError`` when ``output`` does not fit ``n_out``."""
  if output is None:
    return "sign" if n_out == 1 else "logits"
  if output not in OUTPUT_KINDS:
    raise ValueError(f"output must be 'logits', 'sign' or None, got {output!r}.")
  if output == "sign" and n_out != 1:
    raise ValueError(f"output='sign' needs one output unit, the network has {n_out}.")
  if output == "logits" and n_out < 2:
    raise ValueError("output='logits' needs >= 2 output units; one unit is a sign network.")
  return output


def n_classes_of(kind: str, n_out: int) -> int:
  """The number of classes: 2 for a sign network, else the number of outputs."""
  return 2 if kind == "sign" else n_out
