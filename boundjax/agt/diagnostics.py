"""Diagnostics of an AGT run: is the parameter box still narrow enough to certify anything?

AGT's box grows at every step by the spread of the Thm 4.6 bounds (AGT, §4.2-4.3 and the
"Limitations" paragraph of §4: tightness depends on batch size, epochs and architecture). Once
the interval bounds through the box no longer separate the classes the certificate is vacuous:
`fit` then warns with `VacuousCertificateWarning` (rule: `VacuityCheck`), and it raises
`BoxOverflowError` when an endpoint becomes infinite or NaN instead of returning such a box.

The rule measures what the warning claims. After every epoch `fit` certifies a probe set (the
validation points when given, else up to ``VacuityCheck.n_probe`` training points in the
schedule's order; AGT, Lemma 4.4, `boundjax.agt.certify`) and warns when fewer than
``VacuityCheck.min_certified`` of them are certified. The width of the box against the weights
(`BoxStats.ratio`: a leaf's mean width over its layer's mean ``|w|``) is recorded too, but no
threshold on it predicts certification. In ``benchmarks/results/agt_settings.json`` (6-32-2) a
ratio of 0.97 certified nothing (k = 50) while 1.39 still certified 10 % (clip 0.2); in
``benchmarks/results/agt_vacuity.json`` the old threshold 1 stays silent on a 6-32-2 run at
ratio 0.93 that certifies 0 %, a threshold of 0.5 fires on one at 0.53 that certifies 52 %, and
a 6-64-64-2 network certifies only 69 % at ratio 0.011, where 6-32-2 certifies 99 %. The
training probe's certified fraction was within 0.04 of the test set's in all 13 runs. The ratio
is the rule only for "mse", which has no certificate (``VacuityCheck.max_width_ratio``).

"Against the weights" uses a *layer-level* scale: the mean ``|w|`` over the leaf's whole layer
(every leaf under the same parent in the pytree, kernel and bias together). A per-leaf scale
raised false alarms on small bias vectors (bias entries near 0 next to a kernel of normal size,
whose width in a healthy run is still far below the layer's weights).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.core.interval import Interval

#: What shrinks the box (AGT, Thm 4.6: the bound's spread is ~ (k gamma + spread of the
#: per-sample bounds) / b per step, times the step size).
KNOBS = ("a larger batch_size (the spread of Thm 4.6 shrinks like k / b)",
         "a smaller clip_gamma (each added point moves the mean by up to gamma)",
         "a smaller learning_rate or more lr_decay (the box grows by lr x spread per step)",
         "a smaller k_private", "fewer n_epochs")


class VacuousCertificateWarning(UserWarning):
  """The AGT parameter box has outgrown the weights: certificates will (almost) all fail."""


class BoxOverflowError(FloatingPointError):
  """An endpoint of the AGT parameter box became infinite or NaN during training."""


_is_iv = lambda x: isinstance(x, Interval)  # noqa: E731


def layer_names(params: Any) -> tuple[str, ...]:
  """Names of the parameter leaves (``jax.tree_util.keystr`` of their paths)."""
  paths = jax.tree_util.tree_flatten_with_path(params)[0]
  return tuple(jax.tree_util.keystr(p) or "params" for p, _ in paths)


def layer_groups(params: Any) -> tuple[str, ...]:
  """Per leaf, the name of its layer: the path of its parent node (``"params"`` at the root),
  so ``[0]['kernel']`` and ``[0]['bias']`` share the layer ``[0]``."""
  paths = jax.tree_util.tree_flatten_with_path(params)[0]
  return tuple(jax.tree_util.keystr(p[:-1]) or "params" for p, _ in paths)


def layer_weight_scale(params: Any) -> tuple[float, ...]:
  """Per leaf, the mean ``|w|`` over all entries of its layer (`layer_groups`)."""
  groups = layer_groups(params)
  ws = [np.abs(np.asarray(p, np.float64)).ravel() for p in jax.tree_util.tree_leaves(params)]
  total: dict[str, list[float]] = {}
  for g, w in zip(groups, ws):
    t = total.setdefault(g, [0.0, 0])
    t[0] += float(w.sum())
    t[1] += w.size
  return tuple(total[g][0] / max(total[g][1], 1) for g in groups)


@dataclasses.dataclass(frozen=True)
class BoxStats:
  """Per-leaf ("layer") widths of the box and the scale of the nominal weights.

  Attributes:
    layers: leaf names (`layer_names`).
    width_mean, width_max: mean and max of ``upper - lower`` per leaf.
    weight_scale: per leaf, the mean ``|w|`` of the nominal parameters over the leaf's whole
      layer (`layer_weight_scale`: kernel and bias together).
  """
  layers: tuple[str, ...]
  width_mean: tuple[float, ...]
  width_max: tuple[float, ...]
  weight_scale: tuple[float, ...]

  @property
  def ratio(self) -> tuple[float, ...]:
    """``width_mean / weight_scale`` per leaf (inf for an all-zero layer with a width)."""
    return tuple(w / s if s > 0 else (0.0 if w == 0 else float("inf"))
                 for w, s in zip(self.width_mean, self.weight_scale))

  def vacuous_layers(self, max_ratio: float = 1.0) -> tuple[str, ...]:
    """Leaves whose mean width exceeds ``max_ratio`` times the mean |w| of their layer."""
    return tuple(n for n, r in zip(self.layers, self.ratio) if r > max_ratio)


@dataclasses.dataclass(frozen=True)
class VacuityCheck:
  """When `boundjax.agt.fit` warns that its certificates are (nearly) vacuous.

  After each epoch the box certifies a probe set (Lemma 4.4 of AGT, `boundjax.agt.certify`):
  the validation points when `fit` has them, else the first ``n_probe`` training points of the
  schedule. `fit` warns (once) when the certified fraction falls below ``min_certified``.
  For "mse" (a regression: nothing to certify) it warns when some leaf's mean box width
  exceeds ``max_width_ratio`` times its layer's mean ``|w|`` (`BoxStats.ratio`).

  Attributes:
    min_certified: in [0, 1]; default 0.25 (a quarter of the probe points). In
      ``benchmarks/results/agt_vacuity.json`` the runs' test-set certified fractions are
      >= 0.52 or <= 0.14 (the training probe's within 0.04 of them); 0.25 lies in that gap,
      missing no run that certifies < 10 % and warning on none that certifies >= 50 %.
    n_probe: training points certified per epoch without validation data (>= 1); one bound
      pass, compiled once per model.
    max_width_ratio: > 0; the "mse" rule. Default 0.5: in ``agt_settings.json`` every run at
      ratio <= 0.47 certified >= 82 % of the test set and every run at >= 0.97 <= 10 %.
  """
  min_certified: float = 0.25
  n_probe: int = 256
  max_width_ratio: float = 0.5

  def __post_init__(self):
    if isinstance(self.min_certified, bool) or not 0.0 <= self.min_certified <= 1.0:
      raise ValueError(f"VacuityCheck: min_certified must lie in [0, 1], got "
                       f"{self.min_certified!r}.")
    if (isinstance(self.n_probe, bool) or not isinstance(self.n_probe, (int, np.integer))
        or self.n_probe < 1):
      raise ValueError(f"VacuityCheck: n_probe must be a positive int, got {self.n_probe!r}.")
    if isinstance(self.max_width_ratio, bool) or not self.max_width_ratio > 0:
      raise ValueError(f"VacuityCheck: max_width_ratio must be > 0, got "
                       f"{self.max_width_ratio!r}.")

  def fires(self, certified: float | None, stats: BoxStats) -> bool:
    """Whether to warn: ``certified`` (the probe set's certified fraction; None for "mse")
    below ``min_certified``, or for "mse" a leaf wider than ``max_width_ratio``."""
    if certified is not None:
      return certified < self.min_certified
    return bool(stats.vacuous_layers(self.max_width_ratio))


def box_stats(params: Any, bounds: Any) -> BoxStats:
  """`BoxStats` of a box (pytree of `Interval`) around ``params``."""
  ivs = jax.tree_util.tree_leaves(bounds, is_leaf=_is_iv)
  width = [np.asarray(iv.upper - iv.lower, np.float64) for iv in ivs]
  return BoxStats(layer_names(params),
                  tuple(float(np.mean(w)) for w in width),
                  tuple(float(np.max(w)) for w in width),
                  layer_weight_scale(params))


def vacuous_message(stats: BoxStats, epoch: int, config: Any, certified: float | None = None,
                    probe: str = "probe", check: VacuityCheck = VacuityCheck(),
                    when: str | None = None) -> str:
  """The text of `VacuousCertificateWarning`: what was measured, how wide the box is, and what
  helps. ``when`` replaces "after epoch <epoch>" (e.g. "at step 40")."""
  i = int(np.argmax(stats.ratio)) if stats.layers else None
  widest = ("" if i is None else f"widest leaf {stats.layers[i]}: mean width "
            f"{stats.width_mean[i]:.3g} vs its layer's mean |w| {stats.weight_scale[i]:.3g}")
  if certified is not None:
    what = (f"the parameter box certifies only {certified:.1%} of the {probe} points (below "
            f"min_certified={check.min_certified:g}; {widest})")
  else:
    what = (f"the parameter box is wider than {check.max_width_ratio:g}x the weights "
            f"({widest})")
  return (f"AGT (k_private={config.k_private}, batch_size={config.batch_size}, clip_gamma="
          f"{config.clip_gamma}, learning_rate={config.learning_rate}): "
          f"{when or f'after epoch {epoch}'} "
          f"{what}; the certificates are (nearly) vacuous. What helps: " + "; ".join(KNOBS) + ".")


def finite_flags(bounds: Any) -> jax.Array:
  """Per leaf, whether every endpoint of the box is finite (shape (n_leaves,), bool)."""
  ivs = jax.tree_util.tree_leaves(bounds, is_leaf=_is_iv)
  return jnp.stack([jnp.all(jnp.isfinite(iv.lower)) & jnp.all(jnp.isfinite(iv.upper))
                    for iv in ivs])


def overflow_error(step: int, layers: tuple[str, ...], flags: np.ndarray, config: Any
                   ) -> BoxOverflowError:
  """`BoxOverflowError` naming the first step with a non-finite endpoint and its layers."""
  bad = [n for n, ok in zip(layers, flags) if not ok]
  clip = ("clip_gamma is None: per-sample gradients are unclipped, so one bound can overflow; "
          "set clip_gamma" if config.clip_gamma is None else f"clip_gamma={config.clip_gamma}")
  return BoxOverflowError(
      f"AGT: the parameter box overflowed (inf/NaN endpoints) at step {step} in "
      f"{', '.join(bad)} (k_private={config.k_private}, batch_size={config.batch_size}, "
      f"learning_rate={config.learning_rate}, loss={config.loss!r}; {clip}). A box this wide "
      f"certifies nothing. What helps: " + "; ".join(KNOBS) + ".")


@dataclasses.dataclass(frozen=True)
class CheckResult:
  """What `check` measured on a box.

  Attributes:
    certified: the fraction of the probe points the box certifies (AGT, Lemma 4.4); None for
      ``loss="mse"`` (a regression has no certificate).
    stats: the box's widths against the weights (`BoxStats`).
    vacuous: the rule (`VacuityCheck.fires`) says the certificates are (nearly) vacuous.
    message: the warning's text when ``vacuous``, else ``""``.
  """
  certified: float | None
  stats: BoxStats
  vacuous: bool
  message: str


def check(bounds: Any, x: Any, *, apply_fn: Any, config: Any, backend: str = "mlp",
          rule: VacuityCheck = VacuityCheck(), step: int | None = None,
          warn: bool = True) -> CheckResult:
  """The vacuity check of `boundjax.agt.fit`, for a training loop of your own.

  The same measurement and rule as ``fit`` after each epoch: the box certifies the probe points
  ``x`` (AGT, Lemma 4.4, the compiled certification ``fit`` uses), `VacuityCheck.fires` decides,
  and `vacuous_message` words the warning. Raises `BoxOverflowError` when an endpoint of the box
  is infinite or NaN (as ``fit`` does), and warns with `VacuousCertificateWarning` (with
  ``warn``) when the rule fires.

  Args:
    bounds: the box: anything with ``.params`` (nominal parameters) and ``.bounds`` (their
      `Interval` pytree): the ``ParamBox`` of `boundjax.agt.optim` or `fit`'s ``State``.
    x: probe points, e.g. a few hundred training or validation inputs.
    apply_fn: ``apply_fn(params, x) -> outputs``.
    config: the run's `boundjax.agt.Config` (loss, interval product, bound method; its
      settings are quoted in the message).
    backend: "mlp" or "ibp" (`boundjax.agt.bounds`).
    rule: when to call the certificates vacuous (`VacuityCheck`).
    step: the step count, quoted in the message.
    warn: warn when the rule fires (else only report).
  """
  import warnings
  from boundjax.agt.certify import certified_fraction

  params, box = bounds.params, bounds.bounds
  flags = np.asarray(finite_flags(box))
  if not flags.all():
    raise overflow_error(-1 if step is None else int(step), layer_names(params), flags, config)
  stats = box_stats(params, box)
  certified = None
  if config.loss != "mse":
    certified = certified_fraction(apply_fn, config, backend, params, box, jnp.asarray(x))
  vacuous = rule.fires(certified, stats)
  message = ""
  if vacuous:
    when = "now" if step is None else f"at step {int(step)}"
    message = vacuous_message(stats, 0, config, certified, f"{len(x)} probe", rule, when)
    if warn:
      warnings.warn(message, VacuousCertificateWarning, stacklevel=2)
  return CheckResult(certified, stats, bool(vacuous), message)
