"""Diagnostics of an AGT run: how wide the parameter box is against the weights.

AGT's box grows at every step by the spread of the Thm 4.6 bounds (AGT, §4.2-4.3 and the
"Limitations" paragraph of §4: tightness depends on batch size, epochs and architecture). Once
the box is as wide as the weights themselves, interval bounds through it no longer separate
classes and the certificate is vacuous: `fit` then warns with `VacuousCertificateWarning`, and it
raises `BoxOverflowError` when an endpoint becomes infinite or NaN instead of returning such a
box.

"As wide as the weights" is measured against a *layer-level* scale: a leaf is flagged when its
mean width exceeds the mean ``|w|`` over its whole layer (every leaf under the same parent in
the pytree, kernel and bias together). A per-leaf scale raised false alarms on small bias
vectors (bias entries near 0 next to a kernel of normal size, whose width in a healthy run is
still far below the layer's weights).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.interval import Interval

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

  def vacuous_layers(self) -> tuple[str, ...]:
    """Leaves whose mean width exceeds the mean |w| of their layer."""
    return tuple(n for n, r in zip(self.layers, self.ratio) if r > 1)


def box_stats(params: Any, bounds: Any) -> BoxStats:
  """`BoxStats` of a box (pytree of `Interval`) around ``params``."""
  ivs = jax.tree_util.tree_leaves(bounds, is_leaf=_is_iv)
  width = [np.asarray(iv.upper - iv.lower, np.float64) for iv in ivs]
  return BoxStats(layer_names(params),
                  tuple(float(np.mean(w)) for w in width),
                  tuple(float(np.max(w)) for w in width),
                  layer_weight_scale(params))


def vacuous_message(stats: BoxStats, epoch: int, config: Any) -> str:
  """The text of `VacuousCertificateWarning`: which layers, how wide, and what helps."""
  bad = [(n, w, s) for n, w, s, r in zip(stats.layers, stats.width_mean, stats.weight_scale,
                                         stats.ratio) if r > 1]
  where = ", ".join(f"{n}: mean width {w:.3g} vs its layer's mean |w| {s:.3g}"
                    for n, w, s in bad)
  return (f"AGT (k_private={config.k_private}, batch_size={config.batch_size}, clip_gamma="
          f"{config.clip_gamma}, learning_rate={config.learning_rate}): after epoch {epoch} the "
          f"parameter box is wider than the weights ({where}); the certificates are then "
          f"vacuous. What helps: " + "; ".join(KNOBS) + ".")


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
