"""LUCID-Inference (LUCID, §6.3, Alg. 2): label-only access to N with ε-iDP per query.

`LabelOnlyGuard` answers ``f_x(D) = argmax N(x)`` for the leave-one-out neighbours of the
training set D. Given the iDP deterministic bound β_c per class (LUCID, §4, Eq. 1: no input with
``C^c_N(x) >= β_c`` is labelled differently by any leave-one-out network; computed by
`milp.idpdb.compute_betas`, an input here):

* return ``c = argmax N(x)`` without noise iff ``C^c_N(x) > β_c`` (strict: ``C = β_c`` is
  noised); such an answer has local sensitivity 0 and is 0-iDP (LUCID Thm 6.1);
* otherwise answer with the exponential mechanism over the one-hot utility ``u(c') = 1[c' = c]``
  with ``Δu = 1`` (LUCID Lemma 3.2: ε-iDP), and memoise that answer so that repeating x cannot
  average the noise away (bounded memo, oldest evicted).

Ties. A logits network picks the lowest tied index (``argmax``) with confidence 0; a sign network
picks class 1 at ``z = 0`` with confidence 0. A tied input is therefore released without noise
only when ``0 > β_c``, i.e. when the bound certifies that no leave-one-out network disagrees with
c anywhere N's confidence is ``>= β_c`` (which includes the tie). `guard_beta` turns a solver's
bound into such a value (slack for tolerances and float32; ``-inf`` -> 0).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.models import dense_layers
from boundjax.privacy.label_mechanisms import (check_epsilon, exponential_mechanism,
                                               n_classes_of, output_kind, predict_with_confidence)

PyTree = Any
ApplyFn = Callable[[PyTree, jax.Array], jax.Array]


def validate_betas(betas: Any, n_classes: int) -> np.ndarray:
  """β per class as a float64 array of length ``n_classes``.

  Accepts a sequence or a mapping ``{class: β}`` (keys may be strings, as read from JSON). Every
  β must be finite or ``+inf`` (noise every query of that class); NaN and ``-inf`` are refused
  (an infeasible MILP proves there is no leaking input: pass any finite value below every
  confidence, e.g. ``min(β, 0)``, which `guard_beta` does).
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


def guard_beta(beta: float, slack: float = 1e-4) -> float:
  """A solver's β made safe for the guard.

  ``β + slack (1 + |β|)`` for finite β (covers the solver's tolerances and the guard's float32
  forward pass), ``+inf`` for NaN or ``+inf`` (noise everything: sound), and ``0.0`` for ``-inf``
  (no member can ever disagree; 0 keeps ties noised).
  """
  b = float(beta)
  if math.isnan(b) or b == math.inf:
    return math.inf
  if b == -math.inf:
    return 0.0
  return b + slack * (1.0 + abs(b))


def infer_input_shape(params: PyTree) -> tuple[int, ...] | None:
  """``(d,)`` from the first kernel of a Dense stack (`boundjax.models.dense_layers`), else None."""
  try:
    return (int(np.shape(dense_layers(params)[0]["kernel"])[0]),)
  except (ValueError, TypeError, KeyError, IndexError):
    return None


def check_inputs(x: Any, input_shape: tuple[int, ...], what: str) -> np.ndarray:
  """``x`` as float32 ``(n, *input_shape)`` with ``-0.0`` folded into ``0.0`` (one memo key per
  value); raises ``ValueError`` on a wrong shape, a non-numeric dtype, NaN or Inf."""
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
  return a + np.float32(0.0)


def single_input_error(shape: tuple[int, ...], input_shape: tuple[int, ...]) -> str:
  """The message of ``guard(x)`` / ``guard.query(x)`` for an ``x`` that is not one input: what was
  passed, what the call takes, and, for a batch, the call that answers it."""
  msg = (f"LabelOnlyGuard: guard(x) and guard.query(x) answer one input of shape {input_shape}; "
         f"got an array of shape {tuple(shape)}")
  if len(shape) == len(input_shape) + 1 and tuple(shape[1:]) == input_shape:
    return (msg + f", a batch of {shape[0]} inputs. For a batch call guard.query_batch(x), which "
            "returns a GuardAnswer (.labels, .noised, .confidence).")
  return msg + "."


@dataclasses.dataclass(frozen=True)
class GuardAnswer:
  """Answers of `LabelOnlyGuard.query_batch`.

  Attributes:
    labels: ``(n,)`` int64 released labels.
    noised: ``(n,)`` bool, exactly ``confidence <= β`` of the predicted class.
    confidence: ``(n,)`` float32 ``C^c_N(x)`` of the predicted class c.
  """

  labels: np.ndarray
  noised: np.ndarray
  confidence: np.ndarray


@functools.lru_cache(maxsize=32)
def _guard_programs(apply_fn: ApplyFn, kind: str, n_classes: int):
  """Jitted ``decide`` (label, confidence, noised) and ``sample`` (exponential mechanism with
  per-query keys ``fold_in(key, counter)``), shared by every guard of the same network."""

  def decide(p, x, betas):
    pred = predict_with_confidence(apply_fn(p, x), kind)
    return pred.label, pred.confidence, pred.confidence <= betas[pred.label]

  def sample(base_key, counters, labels, epsilon):
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(base_key, counters)
    u = jax.nn.one_hot(labels, n_classes, dtype=jnp.float32)
    return jax.vmap(exponential_mechanism, in_axes=(0, 0, None))(keys, u, epsilon)

  return jax.jit(decide), jax.jit(sample)


class LabelOnlyGuard:
  """LUCID-Inference (LUCID, §6.3, Alg. 2): label-only access to N with ε-iDP per query.

  ``query(x)``: if x was answered with noise before, return the memoised label. Otherwise compute
  ``c = argmax N(x)`` and its confidence; return c when ``C^c_N(x) > β_c`` (0-iDP, no randomness
  consumed); else draw the exponential-mechanism label (utility ``1[c' = c]``, Δu = 1, ε-iDP),
  memoise it and return it.

  Args:
    apply_fn: ``apply_fn(params, x)`` -> outputs of shape ``(n, |C|)`` (logits) or ``(n, 1)``
      (a sign network: class 1 iff ``z >= 0``).
    params: N's parameters.
    betas: β per class (sequence or ``{class: β}``), see `validate_betas`. Any value ≥ the true
      iDP-DB (LUCID, §4, Def. 4.1) is sound; larger values only add noise.
    epsilon: the iDP budget of a noised answer (``ε >= 0``; 0 = uniform label).
    key: the JAX PRNG key of the noise (default ``jax.random.PRNGKey(42)``, as LUCID's code).
    memo_size: the memo's capacity (noised answers kept; the oldest is evicted when full). The
      paper assumes the defender remembers as much as the attacker; an evicted input answered
      again gets fresh noise.
    input_shape: one input's shape; inferred from a Dense stack's parameters when omitted.
    output: ``"logits"``, ``"sign"`` or None (by the number of outputs).

  The memo key is the input's float32 bytes (with ``-0.0`` folded into ``0.0``); inputs that
  differ in any bit are distinct queries, each ε-iDP on its own. `epsilon_spent` reports the
  sequential-composition total ``k ε`` over the k distinct noised answers (an optional account;
  the paper gives none).
  """

  def __init__(self, apply_fn: ApplyFn, params: PyTree, betas: Any, epsilon: float, *,
               key: jax.Array | None = None, memo_size: int = 1_000_000,
               input_shape: Sequence[int] | None = None, output: str | None = None):
    self.epsilon = check_epsilon(epsilon)
    if not isinstance(memo_size, (int, np.integer)) or memo_size < 1:
      raise ValueError(f"LabelOnlyGuard: memo_size must be an integer >= 1, got {memo_size!r}.")
    if key is not None and (not hasattr(key, "shape") or isinstance(key, (int, np.integer))):
      raise ValueError(f"LabelOnlyGuard: key must be a JAX PRNG key (jax.random.PRNGKey(seed)), "
                       f"got {key!r}.")
    shape = tuple(int(s) for s in input_shape) if input_shape is not None else \
        infer_input_shape(params)
    if shape is None:
      raise ValueError("LabelOnlyGuard: cannot infer the input shape from params; pass "
                       "input_shape=(d,).")
    self.input_shape = shape
    self.params = params
    n_out = int(np.shape(jax.eval_shape(apply_fn, params,
                                        jax.ShapeDtypeStruct((1,) + shape, jnp.float32)))[-1])
    self.output = output_kind(n_out, output)
    self.n_classes = n_classes_of(self.output, n_out)
    self.betas = validate_betas(betas, self.n_classes)
    self._betas_f32 = jnp.asarray(self.betas, jnp.float32)
    self.memo_size = int(memo_size)
    self.memo: collections.OrderedDict[bytes, int] = collections.OrderedDict()
    self._key = jax.random.PRNGKey(42) if key is None else key
    self._draws = 0
    self.noised_answers = 0    # fresh exponential-mechanism draws (memo misses)
    self._decide, self._sample = _guard_programs(apply_fn, self.output, self.n_classes)

  @property
  def epsilon_spent(self) -> float:
    """``k ε`` for the k distinct noised answers so far (sequential composition)."""
    return self.noised_answers * self.epsilon

  def reset(self) -> None:
    """Forgets the memo (the noise stream continues)."""
    self.memo.clear()

  def query(self, x: Any) -> int:
    """One label (LUCID Alg. 2 ``Access``) for one input of shape ``input_shape``; ``guard(x)``
    is the same call. A batch goes to `query_batch`."""
    a = np.asarray(x)
    if tuple(a.shape) != tuple(self.input_shape):
      raise ValueError(single_input_error(a.shape, tuple(self.input_shape)))
    return int(self.query_batch(a[None]).labels[0])

  __call__ = query

  def query_batch(self, x: Any) -> GuardAnswer:
    """Answers a batch, row by row as `query` would (duplicate rows share one noised answer).

    Returns:
      `GuardAnswer`; ``noised`` is exactly ``confidence <= β[argmax]``, memoised answers included.
    """
    xs = check_inputs(x, self.input_shape, "LabelOnlyGuard.query_batch")
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
