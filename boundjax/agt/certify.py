"""Certified prediction stability from AGT parameter boxes (AGT, §4.1 and §4.3).

Lemma 4.4: if every model in the box ``T^k`` predicts the nominal label at x, the prediction is
stable at distance k (no dataset within k removals/additions per batch changes it). The check is
one-sided: failing to certify says nothing.

The certificate is about whatever neighbourhood the box was trained for (`boundjax.agt.Config`):

* privacy (``k_private``, "add_remove"): every dataset whose batches differ from the nominal
  ones by up to k removals and k additions (AGT, Thm 4.5);
* unlearning (``neighbourhood="remove"``): up to k removals per batch;
* poisoning (``k_poison``, ``epsilon``, ``label_k_poison``, ``label_epsilon``,
  ``poison_target_idx``, ``paired_poison``; `boundjax.agt.poisoning`): every dataset in which
  each batch has at most ``k_poison`` samples with features moved by up to ``epsilon`` in
  L-infinity and at most ``label_k_poison`` samples with a changed label (Sosnin et al.,
  "Certified Robustness to Data Poisoning in Gradient-Based Training"). A certified test
  point's prediction is then the same for every such poisoning of the training data; the
  test point itself is not perturbed.

In every case the retrained model must follow the same initialisation, schedule, step sizes,
clipping and optimiser as the run that built the box.

* one output (BCE): certified iff ``1[zL > 0] == 1[zU > 0]``;
* several outputs: certified iff the lower bound of ``z_c - z_j`` is > 0 for the nominal class c
  and every j != c. With the "mlp" back-end the difference is folded into the last layer
  (tighter than ``zL_c - zU_j``); with "ibp" the logit bounds are used.
* "mse" models are regressions and have no label: `certify` rejects them.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.agt import bounds as bnd

Array = jax.Array


def predict(apply_fn: Callable, params: Any, x: Any, loss: str = "auto") -> Array:
  """Predicted labels: ``1[z > 0]`` for one output, ``argmax`` otherwise."""
  z = apply_fn(params, jnp.asarray(x))
  if z.ndim == 1 or z.shape[-1] == 1:
    return (z.reshape(z.shape[0]) > 0).astype(jnp.int32)
  return jnp.argmax(z, -1).astype(jnp.int32)


def certify(apply_fn: Callable, params: Any, param_bounds: Any, x: Any, *,
            backend: str = "auto", matmul: str = "midrad", bound_method: str = "interval"
            ) -> np.ndarray:
  """Per test point: True when every model in ``param_bounds`` predicts like ``params``.

  With the box of a poisoning run (`boundjax.agt.fit` with ``Config(k_poison=..., epsilon=...,
  label_k_poison=...)``) True means: no poisoning of the training data within that budget
  changes the prediction (module docstring); with a privacy run, no change of up to
  ``k_private`` points per batch does.

  Args:
    apply_fn: ``apply_fn(params, x) -> logits`` (batched).
    params: nominal parameters (must lie in ``param_bounds``).
    param_bounds: pytree like params with Interval leaves (from `boundjax.agt.fit`).
    x: query points, batched.
    backend: "auto", "mlp" or "ibp" (`boundjax.agt.bounds`).
    matmul: the interval product, `boundjax.ibp`'s names ("midrad", "signsplit"; "exact" and
      "best" with the "ibp" back-end).
    bound_method: "interval" or "crown" (`boundjax.agt.crown`: `boundjax.crown` over the
      parameter box; tighter).

  Returns:
    bool array of shape (n,).
  """
  x = jnp.asarray(x)
  backend = bnd.resolve(backend, apply_fn, params, x[:2], matmul)
  return np.asarray(certified_mask(apply_fn, params, param_bounds, x, backend, matmul,
                                   bound_method))


def certified_mask(apply_fn: Callable, params: Any, param_bounds: Any, x: Array, backend: str,
                   matmul: str = "midrad", bound_method: str = "interval") -> Array:
  """The jittable core of `certify` (``backend`` already resolved to "mlp" or "ibp"): a bool
  array, True where every model in the box predicts the nominal label (Lemma 4.4; the rules
  of the module docstring)."""
  pred = predict(apply_fn, params, x)
  z = apply_fn(params, x)
  if z.ndim == 2 and z.shape[-1] > 1:
    margins = bnd.margin_bounds_fn(backend, matmul, bound_method, apply_fn)
    if margins is not None:
      lo = margins(param_bounds, x, pred)
    else:
      out = bnd.forward_bounds_fn(apply_fn, backend, matmul, bound_method)(param_bounds, x)
      lc = jnp.take_along_axis(out.lower, pred[:, None], -1)
      lo = lc - out.upper
    lo = jnp.where(jax.nn.one_hot(pred, z.shape[-1], dtype=bool), jnp.inf, lo)
    return jnp.all(lo > 0, -1)
  out = bnd.forward_bounds_fn(apply_fn, backend, matmul, bound_method)(param_bounds, x)
  zl, zu = out.lower.reshape(-1), out.upper.reshape(-1)
  return (zl > 0) == (zu > 0)


def max_certified_k(apply_fn: Callable, params: Any, bounds_by_k: Mapping[int, Any], x: Any,
                    **kw: Any) -> np.ndarray:
  """``k'(x) = max{k in K : x certified with T^k}`` (0 if none), by a linear scan (AGT, §4.3).

  The linear scan is sound without assuming certification is monotone in k: every certificate
  is valid on its own. All boxes must come from runs sharing the nominal ``params``.
  """
  x = jnp.asarray(x)
  kmax = np.zeros(x.shape[0], dtype=np.int64)
  for k in sorted(bounds_by_k):
    if k == 0:
      continue
    ok = certify(apply_fn, params, bounds_by_k[k], x, **kw)
    kmax = np.where(ok, np.maximum(kmax, k), kmax)
  return kmax


def check_shared_nominal(params_by_k: Mapping[int, Any], atol: float = 0.0) -> None:
  """Raises ValueError unless every run of a k-sweep has the same nominal parameters (§3.10)."""
  items = list(params_by_k.items())
  if not items:
    return
  k0, p0 = items[0]
  for k, p in items[1:]:
    for a, b in zip(jax.tree_util.tree_leaves(p0), jax.tree_util.tree_leaves(p)):
      if a.shape != b.shape or not np.allclose(np.asarray(a), np.asarray(b), rtol=0, atol=atol):
        raise ValueError(f"k-sweep: the nominal parameters of k={k} differ from those of "
                         f"k={k0}; certificates must share one nominal model (AGT, §4.3).")


@functools.lru_cache(maxsize=64)
def _jitted_certified(apply_fn: Callable, backend: str, matmul: str, bound_method: str):
  """`certified_mask` compiled once per (model, back-end, product, bound method)."""
  return jax.jit(functools.partial(certified_mask, apply_fn, backend=backend, matmul=matmul,
                                   bound_method=bound_method))


def certified_fraction(apply_fn: Callable, config: Any, backend: str, params: Any, box: Any,
                       x: Any) -> float:
  """Fraction of ``x`` certified stable by the parameter box (AGT, Lemma 4.4), with the
  interval product and bound method of ``config`` (a `boundjax.agt.Config`)."""
  fn = _jitted_certified(apply_fn, backend, config.matmul, config.bound_method)
  return float(np.mean(np.asarray(fn(params, box, jnp.asarray(x)))))
