"""`jit`: ``jax.jit`` with the XLA:CPU compiler options boundjax's bounds run fastest with.

Bounding a convolutional network calls the network's convolutions many times over, with the
rows of a linear bound as the batch (CROWN's backward pass; α-CROWN's gradient through it). The
XLA:CPU back-end of jaxlib 0.10 hands a convolution standing alone in its fusion, and some matrix
products, to its YNNPACK library. On the 2-core benchmark machine that ran the CNN benchmark's
16→32-channel VALID convolution (batch 2560, 13×13, kernel 4) in about 150 ms of CPU time,
against 33 ms on XLA's own convolution path. Side by side in one process (median wall times on
`benchmarks/propagation.py`'s networks, float32), keeping YNNPACK for the matrix products only
(``LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT``) against XLA's default: CNN forward 15.5 → 6.2 ms, IBP
33.9 → 15.4 ms, α-CROWN (20 steps) 16.0 → 12.3 s; MLP 784-1024-1024-10 forward 6.6 → 6.2 ms;
MLP 14-50-50-2 CROWN 8.4 → 7.7 ms. Turning every YNNPACK fusion off instead (an empty list)
made the MLPs' forward and IBP passes 20-30 % slower, and adding its elementwise and reduction
fusions back slower still. `jit` therefore compiles with
``xla_cpu_experimental_ynn_fusion_type = LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT``.

These are per-compilation options (``jax.jit(..., compiler_options=...)``): they apply to the
functions compiled through `jit` and nothing else in the process; XLA's global flags
(``XLA_FLAGS``) are left alone. A jaxlib that does not know the option (it is experimental)
rejects it when compiling; `jit` then compiles without it (probed once per back-end, on a
one-element function). Under an outer ``jax.jit`` a `jit`-ed function is inlined and takes the
outer compilation's options: jit the outermost function with `jit` (``bj.jit``) to get them.
The options change nothing but which kernels compute the convolutions: results
differ by the summation order only (float64 in the last bit), and the sound mode's a-priori
error bounds (γ_n) hold for any summation order.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

CPU_COMPILER_OPTIONS: dict[str, Any] = {
    "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}
"""The options `jit` passes on the CPU back-end (see the module docstring)."""


@functools.lru_cache(maxsize=None)
def _accepted(backend: str) -> bool:
  """Whether this jaxlib compiles with `CPU_COMPILER_OPTIONS` on ``backend``."""
  try:
    jax.jit(jnp.negative, compiler_options=CPU_COMPILER_OPTIONS).lower(
        jnp.zeros((), jnp.float32)).compile()
    return True
  except Exception:  # pylint: disable=broad-except  (an option this jaxlib does not know)
    return False


def compiler_options() -> dict[str, Any] | None:
  """The options `jit` compiles with on the default back-end (None: XLA's defaults)."""
  backend = jax.default_backend()
  if backend != "cpu" or not _accepted(backend):
    return None
  return dict(CPU_COMPILER_OPTIONS)


def jit(fn: Callable, **kwargs: Any) -> Callable:
  """``jax.jit(fn, **kwargs)`` compiled with `compiler_options` (on the CPU back-end), e.g.
  ``bj.jit(bj.crown(model.apply))``. Same results as ``jax.jit`` (up to float32 summation
  order), faster on convolutional networks on CPU (module docstring)."""
  options = compiler_options()
  if options is None or "compiler_options" in kwargs:
    return jax.jit(fn, **kwargs)
  return jax.jit(fn, compiler_options=options, **kwargs)
