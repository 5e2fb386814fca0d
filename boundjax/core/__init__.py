"""The core of boundjax (layer 0, with `boundjax.domains` and `boundjax.nn`): what every bound needs.

* `interval`: the `Interval` pytree (a box), its validation and the interval product kernels.
* `rounding`: outward rounding and Higham's ``γ_n`` error bounds (the sound floating-point mode).
* `validation`, `errors`: argument checks naming the user's source line, and the exceptions.
* `program`: the one tracing layer every domain walks (argument splitting, inlining of calls,
  composites recognised by identity); `ir`, `composite`, `options`, `budgets` support it.
* `transforms`: the three transformations side by side: `ibp`, `crown` and `difference`.
* `compile`: `jit`, ``jax.jit`` with the XLA:CPU options the bounds run fastest with.

Nothing here imports an application package, `boundjax.verify` or `milp` (see
``tests/test_layering.py``).
"""
