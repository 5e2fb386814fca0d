"""Small Flax linen models used by the papers' experiments (LUCID, §7; Sphynx, §6).

* `MLP`: fully connected ReLU network, e.g. ``MLP(hidden=(50, 50), out=2)`` (Adult 2×50).
* `Conv1dNet`: LUCID's tabular CNN: two 1×3 convolutions (6 channels, valid, ReLU), flatten,
  Dense(2), ReLU, Dense(2) (LUCID, §7, with its public code's layer sizes; dropout is left out:
  training is deterministic). Its convolutions are `BandedConv1d`: ``nn.Conv`` computed as one
  product with its banded matrix, 3.5x faster to train on a CPU.

Both initialise like PyTorch's defaults, which the papers' code uses: every weight and bias is
drawn from ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` (``kaiming_uniform(a=sqrt(5))`` for weights
works out to the same bound).
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from boundjax import training


def _torch_uniform(fan_in: int):
  """Initializer for ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` (PyTorch's Linear/Conv default)."""
  bound = 1.0 / float(fan_in) ** 0.5

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


class MLP(nn.Module):
  """``x -> Dense -> ReLU -> ... -> Dense(out)``; returns logits of shape ``(..., out)``."""

  hidden: Sequence[int] = (50, 50)
  out: int = 2

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    for width in self.hidden:
      init = _torch_uniform(x.shape[-1])
      x = nn.relu(nn.Dense(width, kernel_init=init, bias_init=init)(x))
    init = _torch_uniform(x.shape[-1])
    return nn.Dense(self.out, kernel_init=init, bias_init=init)(x)


class BandedConv1d(nn.Conv):
  """A 1-D convolution (``padding="VALID"``, stride 1, no dilation) computed as one matrix
  product with its banded (Toeplitz) matrix; same parameters (``kernel`` ``(k, C_in, C_out)``,
  ``bias``) and same outputs as `flax.linen.Conv`.

  ``T[(p + i) C_in + c, p C_out + o] = kernel[i, c, o]``, so ``out[p, o] = sum_{i, c}
  x[p + i, c] kernel[i, c, o] + bias[o]``: the same sum, with zeros added. On a CPU, training
  LUCID's CNN vmapped over 128 members ran 3.5x faster this way than through XLA's
  convolution (channels of 1 and 6 leave the convolution memory-bound). An ``nn.Conv``, so
  `milp.network.from_flax` reads its matrix like any convolution's.
  """

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    ones = lambda v: all(int(a) == 1 for a in (v if isinstance(v, (tuple, list)) else (v or 1,)))
    if not (len(self.kernel_size) == 1 and self.padding == "VALID" and ones(self.strides)
            and ones(self.kernel_dilation) and ones(self.input_dilation)
            and self.feature_group_count == 1):
      raise ValueError("BandedConv1d: only a 1-D kernel, padding='VALID', stride 1, no "
                       "dilation and one feature group.")
    k, c_in, n_in = self.kernel_size[0], x.shape[-1], x.shape[-2]
    kernel = self.param("kernel", self.kernel_init, (k, c_in, self.features))
    bias = self.param("bias", self.bias_init, (self.features,))
    n = n_in - k + 1
    shift = np.zeros((k, n_in, n), np.float32)   # shift[i, p + i, p] = 1
    for i in range(k):
      shift[i, np.arange(n) + i, np.arange(n)] = 1.0
    band = jnp.einsum("ico,ipq->pcqo", kernel, jnp.asarray(shift, kernel.dtype))
    band = band.reshape(n_in * c_in, n * self.features)
    out = x.reshape(x.shape[:-2] + (n_in * c_in,)) @ band
    return out.reshape(x.shape[:-2] + (n, self.features)) + bias


class Conv1dNet(nn.Module):
  """LUCID's tabular CNN over a feature vector ``x`` of shape ``(..., d)`` with ``d >= 5``."""

  channels: int = 6
  out: int = 2

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    if x.shape[-1] < 5:
      raise ValueError(f"Conv1dNet needs at least 5 input features, got {x.shape[-1]}.")
    h = x[..., :, None]                                   # (..., d, 1): NWC
    for i in range(2):
      init = _torch_uniform(3 * h.shape[-1])
      h = nn.relu(BandedConv1d(self.channels, (3,), padding="VALID", kernel_init=init,
                               bias_init=init, name=f"Conv_{i}")(h))
    h = h.reshape(h.shape[:-2] + (-1,))
    init = _torch_uniform(h.shape[-1])
    h = nn.relu(nn.Dense(self.out, kernel_init=init, bias_init=init)(h))
    init = _torch_uniform(h.shape[-1])
    return nn.Dense(self.out, kernel_init=init, bias_init=init)(h)


def _layer_order(names: list[str]) -> list[str]:
  """Creation order: names ``Prefix_i`` sorted by ``i`` when every name has a trailing index
  (Flax's auto-naming), the container's own order otherwise."""
  indices = [re.search(r"_?(\d+)$", n) for n in names]
  if all(indices):
    return [n for _, n in sorted(zip([int(m.group(1)) for m in indices], names))]
  return list(names)


def dense_layers(params: Any, *, stacked: bool = False) -> list[dict]:
  """The Dense layers ``{"kernel": (in, out), "bias": (out,)}`` of a Dense+ReLU stack, in order.

  The one parser of Dense stacks in the package. Accepted containers: a list or tuple of layer
  dicts, a dict ``{"Dense_0": ..., "Dense_1": ...}`` (Flax ``nn.Dense`` naming, any prefix,
  ordered by the trailing number), or either under a single ``"params"`` key (a Flax variable
  dict). Leaves may be arrays or `Interval`s. With ``stacked=True`` every leaf carries a leading
  member axis (``Ensemble.params``: kernels of rank 3). Raises ``ValueError`` naming the layer
  otherwise.
  """
  if isinstance(params, (list, tuple)):
    out = list(params)
  elif isinstance(params, Mapping) and "params" in params and len(params) == 1:
    return dense_layers(params["params"], stacked=stacked)
  elif isinstance(params, Mapping) and params:
    out = [params[n] for n in _layer_order(list(params))]
  else:
    raise ValueError("dense_layers: expected a list of Dense layers or a dict "
                     f"{{'Dense_0': {{...}}, ...}}, got {type(params).__name__}.")
  names = list(params) if isinstance(params, Mapping) else list(range(len(out)))
  names = _layer_order(names) if isinstance(params, Mapping) else names
  for name, layer in zip(names, out):
    if not (isinstance(layer, Mapping) and set(layer) == {"kernel", "bias"}):
      got = sorted(layer) if isinstance(layer, Mapping) else type(layer).__name__
      raise ValueError(f"dense_layers: layer {name!r} must be a dict with keys 'kernel' and "
                       f"'bias' (a Dense layer), got {got}.")
    rank = 3 if stacked else 2
    if len(getattr(layer["kernel"], "shape", ())) != rank:
      raise ValueError(f"dense_layers: layer {name!r} has a kernel of shape "
                       f"{getattr(layer['kernel'], 'shape', None)}; expected rank {rank} "
                       f"({'stacked ' if stacked else ''}Dense kernels).")
  return out


def rebuild_dense(params: Any, new_layers: list) -> Any:
  """``params`` with its Dense layers replaced by ``new_layers`` (same container as `dense_layers` read)."""
  if isinstance(params, (list, tuple)):
    return type(params)(new_layers)
  if isinstance(params, Mapping) and "params" in params and len(params) == 1:
    return {"params": rebuild_dense(params["params"], new_layers)}
  return {n: l for n, l in zip(_layer_order(list(params)), new_layers)}


def mlp_layer_values(params, x: jax.Array) -> tuple[jax.Array, ...]:
  """Every value of a Flax Dense/ReLU MLP (e.g. `MLP`) in order: ``(ẑ1, z1, ẑ2, z2, ..., logits)``.

  ``ẑ_m = z_{m-1} W_m + b_m`` and ``z_m = relu(ẑ_m)`` (no ReLU after the last layer), with the
  layers read by `dense_layers`. Written with plain jnp so
  `boundjax.ibp` and `boundjax.difference` bound every layer at once (per-layer bounds).
  """
  layers = dense_layers(params)
  outs, h = [], x
  for i, layer in enumerate(layers):
    z = h @ layer["kernel"] + layer["bias"]
    outs.append(z)
    if i < len(layers) - 1:
      h = jax.nn.relu(z)
      outs.append(h)
  return tuple(outs)


def fit_full_batch(apply_fn, params, x: jax.Array, y: jax.Array, optimizer, steps: int):
  """``steps`` full-batch optimizer steps on the mean softmax cross-entropy (integer labels).

  The small classifiers of the demo sections train this way: ``optimizer`` is an optax
  transformation (e.g. ``optax.adam(3e-3)``), ``apply_fn(params, x)`` returns logits. It is
  `boundjax.training.train` on ``Schedule(n, batch_size=n, epochs=steps, shuffle="none")``
  (one jitted ``lax.scan``); returns the trained parameters.
  """
  sched = training.Schedule(n=int(x.shape[0]), batch_size=int(x.shape[0]), epochs=steps,
                            shuffle="none")
  grad_fn = training.mean_gradient(apply_fn, training.softmax_cross_entropy)
  run = jax.jit(lambda p, b: training.train(grad_fn, optimizer, p, x, y, b))
  return run(params, sched.batches())
