"""The accuracy comparison of LUCID's Tables 1–3: the guard against its baselines.

`accuracy_table` compares LUCID's guard, Naive-Noise, Naive-iDP and trained DP models at iDP
ε ∈ {0, 0.02, 0.2, 1} and DP ε ∈ {0.02, 0.2, 1}: accuracy decrease (percentage points against
N), fraction of noised queries and the guard's per-query latency (`guard_latency`; the paper
reports 0.16 ms). `format_table` prints it.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.privacy.baselines import naive_idp, naive_noise, network_outputs
from boundjax.privacy.guard import LabelOnlyGuard, validate_betas
from boundjax.privacy.label_mechanisms import (keep_probability, n_classes_of,
                                               predict_with_confidence)

PyTree = Any
ApplyFn = Callable[[PyTree, jax.Array], jax.Array]

#: ε values of the paper's iDP comparison (Tables 1 and 2) and of its DP baselines (Table 3;
#: DP cannot reach ε = 0, so 0.02 stands in for it).
IDP_EPSILONS: tuple[float, ...] = (0.0, 0.02, 0.2, 1.0)
DP_EPSILONS: tuple[float, ...] = (0.02, 0.2, 1.0)

#: LUCID, §7, Adult 2×50 (accuracy in %): Table 1 (LUCID), Table 2 (Naive-Noise,
#: Naive-iDP), Table 3 (DP-SGD, ALIBI); and the headline averages over the 11 networks (§7).
PAPER_ADULT_2X50 = {
    "acc_no_protection": 83.1,
    "beta": {"0": 0.55, "1": 0.63},
    "LUCID": {"0": 82.4, "0.2": 82.4, "1": 82.5, "latency_ms": 0.1},
    "Naive-Noise": {"0": 49.9, "0.2": 51.7, "1": 58.2},
    "Naive-iDP": {"0": 83.1, "0.2": 82.9, "1": 83.1},
    "DP-SGD": {"0.02": 23.6, "0.2": 76.3, "1": 76.3},
    "ALIBI": {"0.02": 67.4, "0.2": 77.4, "1": 82.2},
}
#: The same for Adult conv (LUCID's CNN).
PAPER_ADULT_CONV = {
    "acc_no_protection": 79.2,
    "beta": {"0": 0.29, "1": 0.52},
    "LUCID": {"0": 80.1, "0.2": 80.1, "1": 80.0, "latency_ms": 0.2},
    "Naive-Noise": {"0": 49.9, "0.2": 51.4, "1": 57.2},
    "Naive-iDP": {"0": 79.2, "0.2": 79.5, "1": 79.5},
    "DP-SGD": {"0.02": 46.2, "0.2": 76.4, "1": 76.4},
    "ALIBI": {"0.02": 23.6, "0.2": 74.6, "1": 76.4},
}
PAPER_HEADLINE = {"LUCID_decrease": {"0": 1.4, "0.2": 1.3, "1": 1.1},
                  "DP_baselines_decrease": 12.7, "latency_ms": 0.16}

_GUARANTEES = {"DP-SGD": "(eps, delta)-DP", "ALIBI": "eps-label-DP"}


@dataclasses.dataclass
class Latency:
  """Per-query latency of ``LabelOnlyGuard.query`` in ms over ``queries`` single queries."""

  mean_ms: float
  median_ms: float
  max_ms: float
  queries: int


def _accuracy(labels: np.ndarray, y: np.ndarray) -> float:
  return float(np.mean(np.asarray(labels) == np.asarray(y)))


def guard_latency(guard: LabelOnlyGuard, x: Any, n: int = 200) -> Latency:
  """Per-query latency of ``guard.query`` on the first ``n`` rows of ``x``.

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
  return Latency(float(t_ms.mean()), float(np.median(t_ms)), float(t_ms.max()), int(t_ms.size))


@dataclasses.dataclass
class AccuracyRow:
  """One mechanism at one ε in `accuracy_table`.

  Attributes:
    mechanism: ``"LUCID"``, ``"Naive-Noise"``, ``"Naive-iDP"`` or a trained model's name.
    guarantee: ``"eps-iDP"``, ``"eps-DP"``, ``"(eps, delta)-DP"``, ``"eps-label-DP"``.
    epsilon: the privacy parameter.
    accuracy, accuracy_std: mean and standard deviation over ``repeats`` noise draws.
    decrease_pp: N's accuracy minus ``accuracy``, in percentage points (negative: better than N).
    repeats: noise draws.
    expected_accuracy: the exact expectation over the noise (guard and Naive-Noise), or None.
    noised_fraction: fraction of noised queries (guard, Naive-Noise, Naive-iDP), or None.
  """

  mechanism: str
  guarantee: str
  epsilon: float
  accuracy: float
  accuracy_std: float
  decrease_pp: float
  repeats: int
  expected_accuracy: float | None = None
  noised_fraction: float | None = None


@dataclasses.dataclass
class AccuracyTable:
  """`accuracy_table`'s result; `as_dict` / `from_dict` convert to and from JSON-ready dicts.

  Attributes:
    acc_no_protection: N's accuracy.
    n_test: test inputs; n_classes: classes.
    betas: β per class used by the guard.
    rows: one `AccuracyRow` per mechanism and ε.
    latency: the guard's single-query latency (`guard_latency`).
    batch_us_per_query: µs per query when the whole test set is one batch.
    idp_epsilons, dp_epsilons: the ε values compared.
  """

  acc_no_protection: float
  n_test: int
  n_classes: int
  betas: list[float]
  rows: list[AccuracyRow]
  latency: Latency | None
  batch_us_per_query: float
  idp_epsilons: list[float]
  dp_epsilons: list[float]

  def row(self, mechanism: str, epsilon: float) -> AccuracyRow:
    """The row of ``mechanism`` at ``epsilon``; raises ``KeyError`` when there is none."""
    for r in self.rows:
      if r.mechanism == mechanism and r.epsilon == float(epsilon):
        return r
    raise KeyError(f"no row for {mechanism!r} at epsilon {epsilon}.")

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: Mapping) -> "AccuracyTable":
    lat = d.get("latency")
    fields = {f.name for f in dataclasses.fields(AccuracyRow)}
    rows = [AccuracyRow(**{k: v for k, v in r.items() if k in fields}) for r in d["rows"]]
    return cls(float(d["acc_no_protection"]), int(d["n_test"]), int(d["n_classes"]),
               list(d["betas"]), rows, Latency(**lat) if lat else None,
               float(d["batch_us_per_query"]), list(d.get("idp_epsilons", [])),
               list(d.get("dp_epsilons", [])))


def accuracy_table(apply_fn: ApplyFn, params: PyTree, betas: Any, x: Any, y: Any, *,
                   idp_epsilons: Sequence[float] = IDP_EPSILONS,
                   dp_epsilons: Sequence[float] = DP_EPSILONS,
                   members: PyTree | None = None,
                   trained: Mapping[str, Mapping[float, tuple[ApplyFn, PyTree]]] | None = None,
                   repeats: int = 10, key: jax.Array | None = None, latency_queries: int = 200,
                   input_shape: Sequence[int] | None = None, output: str | None = None
                   ) -> AccuracyTable:
  """Accuracy decrease of each mechanism against N on ``(x, y)`` (LUCID Tables 1–3).

  Rows (accuracy decrease = N's accuracy − the mechanism's, in percentage points; negative means
  better than N):

  * ``LUCID`` (the guard, ε-iDP) and ``Naive-Noise`` (ε-DP) at every ε of ``idp_epsilons``,
    averaged over ``repeats`` noise draws (fresh guard and memo per draw), with the exact
    expected accuracy beside the empirical mean, and the fraction of noised queries;
  * ``Naive-iDP`` (ε-iDP; only when ``members``, the leave-one-out family, is given);
  * every model in ``trained`` (``{"DP-SGD": {ε: (apply_fn, params)}, "ALIBI": ...}``), DP
    models trained at ``dp_epsilons`` (their noise is in the training; one evaluation each).

  Also the guard's per-query latency (`guard_latency`) and N's accuracy. ``key`` (default
  ``PRNGKey(0)``) draws every noise.
  """
  xs, yy = np.asarray(x, np.float32), np.asarray(y, np.int64)
  if xs.shape[0] != yy.shape[0]:
    raise ValueError(f"accuracy_table: {xs.shape[0]} inputs but {yy.shape[0]} labels.")
  if repeats < 1:
    raise ValueError(f"accuracy_table: repeats must be >= 1, got {repeats}.")
  key = jax.random.PRNGKey(0) if key is None else key
  k_guard, k_noise, k_idp = jax.random.split(key, 3)
  shape = tuple(input_shape or xs.shape[1:])
  z, kind = network_outputs(apply_fn, params, xs, output)
  pred = predict_with_confidence(z, kind)
  pred_label = np.asarray(pred.label)
  k = n_classes_of(kind, int(z.shape[-1]))
  base = _accuracy(pred_label, yy)
  correct = pred_label == yy
  rows: list[AccuracyRow] = []

  def row(name, guarantee, eps, accs, expected=None, noised=None):
    accs = np.asarray(accs, np.float64)
    rows.append(AccuracyRow(name, guarantee, float(eps), float(accs.mean()), float(accs.std()),
                            100.0 * (base - float(accs.mean())), int(accs.size),
                            None if expected is None else float(expected),
                            None if noised is None else float(noised)))

  for i, eps in enumerate(idp_epsilons):
    keep = keep_probability(eps, k)
    accs, frac = [], None
    for r in range(repeats):
      g = LabelOnlyGuard(apply_fn, params, betas, eps,
                         key=jax.random.fold_in(k_guard, i * repeats + r), input_shape=shape,
                         output=output)
      ans = g.query_batch(xs)
      accs.append(_accuracy(ans.labels, yy))
      frac = float(ans.noised.mean())
      noised_mask = ans.noised
    expected = np.mean(np.where(noised_mask, np.where(correct, keep, (1 - keep) / (k - 1)),
                                correct))
    row("LUCID", "eps-iDP", eps, accs, expected, frac)
    nn_accs = [_accuracy(naive_noise(jax.random.fold_in(k_noise, i * repeats + r), apply_fn,
                                     params, xs, eps, output), yy) for r in range(repeats)]
    row("Naive-Noise", "eps-DP", eps, nn_accs,
        np.mean(np.where(correct, keep, (1 - keep) / (k - 1))), 1.0)
    if members is not None:
      res = [naive_idp(jax.random.fold_in(k_idp, i * repeats + r), apply_fn, params, members,
                       xs, eps, output) for r in range(repeats)]
      row("Naive-iDP", "eps-iDP", eps, [_accuracy(a.labels, yy) for a in res], None,
          float(res[0].noised.mean()))
  g = LabelOnlyGuard(apply_fn, params, betas, 0.0, key=k_guard, input_shape=shape, output=output)
  latency = guard_latency(g, xs, latency_queries)
  t = time.perf_counter()
  LabelOnlyGuard(apply_fn, params, betas, 0.0, key=k_guard, input_shape=shape,
                 output=output).query_batch(xs)
  batch_us = 1e6 * (time.perf_counter() - t) / max(len(xs), 1)
  for name, by_eps in (trained or {}).items():
    for eps in sorted(by_eps):
      fn, p = by_eps[eps]
      zz, kk = network_outputs(fn, p, xs, output)
      row(name, _GUARANTEES.get(name, "eps-DP"), eps,
          [_accuracy(np.asarray(predict_with_confidence(zz, kk).label), yy)])
  return AccuracyTable(base, int(len(yy)), k, [float(b) for b in validate_betas(betas, k)], rows,
                       latency, batch_us, list(map(float, idp_epsilons)),
                       list(map(float, dp_epsilons)))


def format_table(table: AccuracyTable | Mapping) -> str:
  """A plain-text table of `accuracy_table`'s rows (also from its `AccuracyTable.as_dict`)."""
  t = table if isinstance(table, AccuracyTable) else AccuracyTable.from_dict(table)
  head = ("mechanism", "guarantee", "eps", "acc %", "decrease pp", "noised %")
  lines = [f"N without protection: {100 * t.acc_no_protection:.2f}% on "
           f"{t.n_test} test inputs; beta = {t.betas}"]
  rows = [head]
  for r in t.rows:
    rows.append((r.mechanism, r.guarantee, f"{r.epsilon:g}", f"{100 * r.accuracy:.2f}",
                 f"{r.decrease_pp:+.2f}",
                 "-" if r.noised_fraction is None else f"{100 * r.noised_fraction:.1f}"))
  w = [max(len(str(r[i])) for r in rows) for i in range(len(head))]
  lines += ["  ".join(str(c).ljust(wi) for c, wi in zip(r, w)).rstrip() for r in rows]
  if t.latency:
    lines.append(f"guard latency: {t.latency.mean_ms:.3f} ms/query mean, "
                 f"{t.latency.max_ms:.3f} ms max (single queries); "
                 f"{t.batch_us_per_query:.2f} us/query in one batch")
  return "\n".join(lines)
