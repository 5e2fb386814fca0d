"""`crown`: the transformation (options, tracing, caching, batching)."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from boundjax.core import options
from boundjax.core.compile import jit
from boundjax.core import program as prog_lib
from boundjax.core.program import Var as _Var
from boundjax.core.errors import BoundError, MemoryBudgetError
from boundjax.core.interval import Interval, is_interval, validate_arguments


from boundjax.domains.linear.rules import (
    INTERMEDIATE_MODES, CrownProgram, classify_program, eval_concrete, from_core, is_float,
    S_SHAPED, low_precision, read_value, warn_fallbacks)
from boundjax.domains.linear.backward import Ctx, run_backward, unstable_fraction
from boundjax.domains.linear.prefix import (ancestors_of, build_prefix, conv_temporaries,
                                             interval_exact)
from boundjax.domains.linear.windows import (
    patch_plan, windows_bytes)


# ----------------------------------------------------------------------------------------------
# The transformation
# ----------------------------------------------------------------------------------------------

def _is_array_like(x: Any) -> bool:
  return isinstance(x, (jax.Array, np.ndarray, np.generic)) or isinstance(x, jax.core.Tracer)


def _targets(prog: CrownProgram, intermediate: str, outputs: bool = True) -> list[_Var]:
  """Variables bounded by a backward pass of their own, in program order: with
  ``intermediate="crown"`` the inputs of every ReLU and relaxed equation and the affine inputs of
  fallback equations; the abstract outputs unless ``outputs=False`` (full-precision floats
  only)."""
  targets: list = []

  def add(x):
    if isinstance(x, _Var) and x in prog.abstract and is_float(x.aval) \
        and not low_precision(x.aval) and x not in targets:
      targets.append(x)

  if intermediate == "crown":
    for e in prog.eqns:
      if e.kind == "relu":
        add(e.invars[e.abstract_pos[0]])
      elif e.kind == "nonlinear" and e.mode == "dot":
        for x in e.relax_in:  # (a ReLU output is as tight as its input's bound makes it)
          j = prog.producer.get(x)
          if j is not None and prog.eqns[j].kind != "relu":
            add(x)
      elif e.kind == "nonlinear" and e.mode != "select":
        for x in e.relax_in:
          add(x)
      elif e.kind == "fallback":
        for p in e.abstract_pos:
          j = prog.producer.get(e.invars[p])
          if j is not None and prog.eqns[j].kind == "affine":
            add(e.invars[p])
  for v in prog.outvars if outputs else ():
    add(v)
  return targets


def _lambda_bytes(prog: CrownProgram, targets: list[_Var], ancestors: dict) -> int:
  """Largest per-example backward state (both bounds), in bytes: sizes the chunks."""
  best = 0
  for t in targets:
    sizes = [t.size] + [v.size for i in ancestors[t] for v in _backward_operands(prog.eqns[i])]
    best = max(best, 2 * t.size * max(sizes) * jnp.dtype(t.aval.dtype).itemsize)
  return best


def _temporary_bytes(prog: CrownProgram, targets: list[_Var], ancestors: dict) -> int:
  """Largest per-example bytes a strided convolution's transpose or its derivative holds
  beside the backward state of a target (`prefix.conv_temporaries`, both bounds' rows)."""
  best = 0
  for t in targets:
    per_row = max((conv_temporaries(prog.eqns[i]) for i in ancestors[t]), default=0)
    best = max(best, 2 * t.size * per_row * jnp.dtype(t.aval.dtype).itemsize)
  return best


def _backward_operands(e) -> list:
  """The operands whose coefficients a backward pass through ``e`` stores (a parameter box
  concretised at once by a product of two boxes is not one)."""
  if e.kind == "nonlinear" and e.mode == "dot":
    return list(e.relax_in)
  return [e.invars[p] for p in e.abstract_pos]


def crown(fn: Callable, *, intermediate: str = "crown", batch_axis: int | None = 0,
          sound: bool = False, chunk_size: int | None = None,
          memory_bytes: int = 1 << 30, patches: bool = True, spec: Any = None,
          alpha: bool = False, alpha_steps: int = 20, alpha_lr: float = 0.1,
          beta: bool = False, splits: bool = False, return_info: bool = False,
          unstable_rows: float | str = "auto", alpha_intermediate: bool = False,
          alpha_objective: str = "both") -> Callable:
  """CROWN: backward linear bound propagation of ``fn`` over its `Interval` arguments.

  The method, its relaxations and their costs are described in the docstring of the package
  `boundjax.domains.linear` (``help(boundjax.domains.linear)``); the options below name the
  paragraph of that docstring that explains them.

  Args:
    fn: a JAX function, e.g. a Flax linen ``model.apply``: affine operations and ReLUs are
      handled exactly, the nonlinearities listed in `boundjax.domains.linear`'s docstring by
      linear relaxations,
      anything else with an interval rule by its interval bound (with a warning).
    intermediate: where ReLU pre-activation bounds come from: "crown" (a backward pass per ReLU
      layer; tightest) or "ibp" (interval propagation; CROWN-IBP, much cheaper).
    batch_axis: axis along which the `Interval` leaves hold independent examples (the rule:
      *Batching* in `boundjax.domains.linear`'s docstring), or None to bound the whole call as
      one problem.
    sound: round every bound outward by an a-priori bound on the float error so it holds in
      exact arithmetic, and run every product at ``precision=HIGHEST`` (*Sound floating
      point* in `boundjax.domains.linear`'s docstring); the same option as
      ``bj.ibp(fn, sound=True)``.
    chunk_size: examples per vmapped chunk; default: as many as fit in ``memory_bytes``.
    memory_bytes: memory budget for the backward state of one chunk.
    patches: compute the backward pass of a local layer (a convolution behind one ReLU layer
      that follows a convolution of the input) on receptive-field windows (*Windows* in
      `boundjax.domains.linear`'s docstring); the bounds equal the dense pass up to the order
      of float sums (in ``sound`` mode, each widened by its own rounding slack).
    spec: a specification matrix ``C``: bound ``C @ y`` instead of ``y``, where ``y`` is ``fn``'s
      one box-dependent output, flattened per example (``m`` entries). ``C`` of shape (k, m) is
      used for every example; with ``batch_axis=0`` a ``C`` of shape (batch, k, m) gives row i
      of the batch its own ``C[i]`` (e.g. label-dependent margins ``y_label - y_j``). The
      backward pass starts from ``Λ = C`` (CROWN, Zhang et al. 2018, §3.3: bounding a linear
      function of the outputs is tighter than combining bounds of each output). The output is
      an `Interval` of shape (batch, k) (or (k,) with ``batch_axis=None``). Not with
      ``sound``.
    alpha: α-CROWN (Xu et al., ICLR 2021): optimise the lower slopes of unstable ReLU neurons
      in [0, 1] for the bounds of the outputs with ``alpha_steps`` Adam steps of learning rate
      ``alpha_lr`` (gradients through the bound); never looser than CROWN. One set of slopes
      per row of the bounds (per row of ``spec``). Intermediate bounds stay CROWN's unless
      ``alpha_intermediate``.
    alpha_intermediate: with ``alpha`` and ``intermediate="crown"``, the bounds of every ReLU
      layer's input get their own slopes too (one set per neuron of the layer), optimised
      with the output's for the output's bound (α-CROWN, §3.2: the loss sees them through the
      intermediate bounds they tighten); each step then costs a whole CROWN pass instead of
      the output's. The intermediate bounds are met with CROWN's, and the output's bound is
      never looser than CROWN's. With logistic/tanh equations, ``alpha`` also optimises their
      tangent points (one pair per row and neuron, ``rules.s_shaped_lines_at``; every choice
      is a sound relaxation).
    alpha_objective: what α's steps minimise: ``"both"`` (default) the total width, upper
      minus lower bounds; ``"lower"`` (``"upper"``) only the lower (upper) bounds, when only
      one side is wanted (a verifier proving ``C y - d > 0``): the slopes shared by the rows,
      the intermediate layers', then serve that side alone. The other side's bounds are still
      returned, never looser than CROWN's. ``"lower_only"``: as ``"lower"``, and the output's
      backward passes carry the lower-bound rows alone (half their work) when every equation
      behind the output is affine, a ReLU or bounded by intervals
      (`backward.ONE_SIDED_KINDS`); the upper bounds returned are then the interval ones, and
      ``return_info``'s α and β hold one side, ``(1, m, n)`` per node (a warm start may hold
      one side or two).
    beta: β-CROWN (Wang et al., NeurIPS 2021, §3.1): with split constraints (``splits``),
      optimise their multipliers ``β >= 0`` together with α (implies ``alpha``): on the set
      where ``s·z >= 0`` holds, ``min g >= min (g - β s z)`` for every ``β >= 0``.
    splits: the returned function takes keyword-only arguments describing *sub-problems* of
      the box (they are not passed to ``fn``); the bounds then hold over ``{x in the box : the
      split constraints hold}``. The ReLU nodes are the distinct box-dependent inputs ``z`` of
      ``max(z, c)`` / ``min(z, c)`` with a concrete ``c`` (``jax.nn.relu``, ``jnp.maximum(z,
      0)``, clips), in program order; ``info.pre`` lists them. Arguments, one entry per node
      (or None for none), each flattened per example and with a leading batch axis when
      ``batch_axis=0`` (one sub-problem per example: its own box, splits and bounds):

      * ``splits``: signs (n,) — ``+1``: ``σ(z - c) >= 0`` (a ReLU ``max(z, 0)`` is active,
        ``z >= 0``), ``-1``: ``σ(z - c) <= 0`` (inactive, ``z <= 0``), ``0``: free (σ = 1 for
        max, -1 for min). Split nodes' bounds are clipped (``l <- max(l, 0)``, ``u <- min(u,
        0)``), so split ReLUs are exact; with ``beta`` the constraints enter the output's
        bounds through their multipliers. A sub-problem whose clipped bounds are empty is
        infeasible: its outputs get ``[+inf, -inf]`` (and ``info.infeasible``).
      * ``pre``: ``(lo, hi)`` pairs known to bound the node's input on the sub-problem (e.g.
        its parent's bounds; clipped by the parent's splits): met with the computed ones. With
        ``intermediate="ibp"`` this reuses given intermediate bounds (β-CROWN's fast mode,
        §3.3) at the cost of one forward interval pass.
      * ``warm``: ``(alpha, beta)`` from an earlier call's info (same nodes, rows and batch),
        the start of the optimisation.
    return_info: return ``(bounds, info)``, with ``info`` a `CrownInfo` about ``fn``'s one
      box-dependent output (its rows: ``spec``'s, or the flattened output): the nodes' input
      bounds, infeasibility, α and β reached, and the coefficients ``Λ`` of the lower bounds
      on every node's output and on every box input (for branching heuristics such as BaBSR,
      Bunel et al. 2020, §5.1, and for the box corners that minimise the linear bound).
    unstable_rows: with ``intermediate="crown"``, the back-substitution of a ReLU layer's
      input starts only from its neurons that are unstable on their interval box (met with
      ``pre`` and the splits): a stable neuron's relaxation is exact, so a tighter bound of it
      changes no output bound (auto_LiRPA and α,β-CROWN do the same). A float ``f`` in (0, 1]:
      at most ``ceil(f n)`` rows per layer of ``n`` neurons (the first unstable ones by index;
      ``1.0``: every row, unstable or not); ``"auto"`` (default): outside ``jax.jit``, ``f``
      is measured by an interval pass over the batch and rounded up to a power of two (at
      least 1/64), so that no unstable neuron is left out; under an outer trace, ``1.0``.
      Any value gives sound bounds; the outputs' bounds do not depend on it, only the
      intermediate boxes of stable neurons (``info.pre``) may be looser.

  Returns:
    A function with ``fn``'s signature: any pytree leaf may be an `Interval` (the input box;
    concrete leaves are parameters). The output has `Interval` leaves where the box reaches.

  Raises:
    ValueError: bad options, an Interval leaf that is not float or has mismatched endpoints, or
      Interval leaves whose batch sizes disagree.
    UnsupportedPrimitiveError: an operation on box-dependent values with neither a linear
      relaxation nor an interval rule (named, with the source line).
  """
  if intermediate not in INTERMEDIATE_MODES:
    raise ValueError(f"crown: intermediate must be one of {INTERMEDIATE_MODES}, "
                     f"got {intermediate!r}")
  if batch_axis is not None and (isinstance(batch_axis, bool) or not isinstance(batch_axis, int)):
    raise ValueError(f"crown: batch_axis must be an int or None, got {batch_axis!r}")
  if not isinstance(sound, bool):
    raise ValueError(f"crown: sound must be a bool, got {sound!r}")
  if not isinstance(patches, bool):
    raise ValueError(f"crown: patches must be a bool, got {patches!r}")
  if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
    raise ValueError(f"crown: chunk_size must be a positive int, got {chunk_size!r}")
  if not isinstance(alpha, bool):
    raise ValueError(f"crown: alpha must be a bool, got {alpha!r}")
  for name, flag in (("beta", beta), ("splits", splits), ("return_info", return_info),
                     ("alpha_intermediate", alpha_intermediate)):
    if not isinstance(flag, bool):
      raise ValueError(f"crown: {name} must be a bool, got {flag!r}")
  if alpha_objective not in ("both", "lower", "upper", "lower_only"):
    raise ValueError(f"crown: alpha_objective must be 'both', 'lower', 'upper' or "
                     f"'lower_only', got {alpha_objective!r}")
  alpha = alpha or beta
  alpha_steps = options.integer("crown: alpha_steps", alpha_steps, minimum=1)
  alpha_lr = options.number("crown: alpha_lr", alpha_lr, positive=True)
  memory_bytes = options.integer("crown: memory_bytes", memory_bytes, minimum=1)
  if unstable_rows != "auto" and (isinstance(unstable_rows, bool) or not isinstance(
      unstable_rows, (int, float)) or not 0 < unstable_rows <= 1):
    raise ValueError(f"crown: unstable_rows must be 'auto' or a number in (0, 1], got "
                     f"{unstable_rows!r}")
  if spec is not None:
    spec = jnp.asarray(spec)
    if not jnp.issubdtype(spec.dtype, jnp.floating) or spec.ndim not in (2, 3):
      raise ValueError(f"crown: spec must be a float matrix (k, m) or (batch, k, m), got "
                       f"shape {spec.shape} and dtype {spec.dtype}")
    options.finite_array("crown: spec", spec)
    if spec.ndim == 3 and batch_axis != 0:
      raise ValueError("crown: a per-example spec (batch, k, m) needs batch_axis=0")
    if batch_axis not in (0, None):
      raise ValueError("crown: spec needs batch_axis=0 or None")
    if sound:
      raise ValueError("crown: spec is not supported with sound=True")

  cache: dict = {}

  @functools.wraps(fn)
  def bounded(*args, **kwargs):
    data = None
    if splits:
      data = {"splits": kwargs.pop("splits", None), "pre": kwargs.pop("pre", None),
              "warm": kwargs.pop("warm", None)}
    arguments = prog_lib.split_arguments(args, kwargs)
    validate_arguments(arguments.leaves, where="bj.crown")
    leaves, treedef, dyn = arguments.leaves, arguments.treedef, arguments.dynamic_index
    boxes_idx = [i for i in dyn if arguments.kinds[i] == "box"]
    if not boxes_idx:
      if return_info:
        raise ValueError("crown: return_info needs an Interval argument")
      return fn(*args, **kwargs)
    for i in boxes_idx:
      _check_box(leaves[i])
    axes = _batch_axes(leaves, boxes_idx, batch_axis)
    n_batch = None if axes is None else leaves[boxes_idx[0]].lower.shape[axes[boxes_idx[0]]]

    def one_example(i, shape):
      shape = list(shape)
      if axes is not None:
        shape[axes[i]] = 1
      return tuple(shape)

    def finish(results, out_tree, core, nodes):
      if return_info:
        results, info = results
      results = prog_lib.check_outputs(results, where="bj.crown", program=core)
      out = jax.tree_util.tree_unflatten(out_tree, results)
      return (out, _make_info(info)) if return_info else out

    key = _cache_key(leaves, treedef, dyn)
    if key is not None and key in cache:
      programs, out_tree, core, nodes = cache[key]
    else:
      if axes is not None and n_batch > 1 and key is not None:
        _check_examples_independent(fn, arguments, axes, batch_axis)
      core = prog_lib.trace(fn, arguments, box_shape=one_example, precision_highest=sound)
      out_tree = core.out_tree
      prog = from_core(core)
      classify_program(prog, [v in core.depends for v in core.invars], sound)
      warn_fallbacks(prog)
      spec_var = _spec_target(prog, spec, n_batch if axes is not None else None)
      nodes = prog_lib.relu_nodes(prog)  # after classification: its `abstract_pos`
      if return_info and spec_var is None:
        _spec_target(prog, jnp.zeros((1, _one_output(prog).size)), None)
      programs = _Programs(prog, spec_var, nodes, axes, boxes_idx, n_batch, batch_axis)
      if key is not None and len(cache) < 16:
        cache[key] = (programs, out_tree, core, nodes)
    packed = _pack_data(data, nodes, None if axes is None else n_batch)
    values = [leaves[i] for i in dyn]
    with _precision(sound):  # the backward pass's own products too, not only fn's
      share = 1.0
      if intermediate == "crown" and programs.nodes:
        share = float(unstable_rows) if unstable_rows != "auto" else \
            1.0 if key is None else _rounded_share(programs.screen(values, packed))
      results = programs.bounds(share, _traced(values, spec, packed))(values, spec, packed)
    return finish(results, out_tree, core, nodes)

  @dataclasses.dataclass
  class _Programs:
    """The compiled programs of one call signature: the bounds for each row share, and the
    screening pass that measures the share (``unstable_rows="auto"``)."""
    prog: CrownProgram
    spec_var: Any
    nodes: tuple
    axes: dict | None
    boxes_idx: list
    n_batch: int | None
    batch_axis: int | None
    by_share: dict = dataclasses.field(default_factory=dict)
    screen_fn: Any = None

    def context(self, values, share: float) -> tuple:
      prog = self.prog
      cenv = eval_concrete(prog, [None if is_interval(v) else v for v in values])
      targets = _targets(prog, intermediate)
      ancestors = {t: ancestors_of(prog, t) for t in targets}
      prefixes = {t: build_prefix(prog, cenv, t, ancestors[t], sound) for t in targets}
      outs = set(v for v in prog.outvars if isinstance(v, _Var))
      # intermediate targets the interval pass bounds exactly: no backward pass of their own
      # (`run_backward` reads an output that is one from its intermediate bound, unless α or
      # `return_info` bounds it again)
      inner = set(_targets(prog, intermediate, outputs=False))
      again = bool(alpha) or return_info or intermediate != "crown"
      exact = frozenset(t for t in inner if interval_exact(prog, ancestors[t])
                        and (t not in outs or not (again or t is self.spec_var)))
      plans = {}
      if patches:
        plans = {t: patch_plan(prog, cenv, t, prefixes, ancestors, sound) for t in targets
                 if t not in exact}
        plans = {t: p for t, p in plans.items() if p is not None}
      caps = {x: math.ceil(share * x.size) for x, _ in self.nodes
              if x in prefixes and x not in outs and math.ceil(share * x.size) < x.size}
      ctx = Ctx(prog, cenv, sound, intermediate, prefixes, ancestors, plans,
                self.spec_var, self.spec_var is not None and self.axes is not None,
                alpha_steps if alpha else 0, float(alpha_lr), beta, self.nodes, return_info,
                caps, alpha_intermediate, _s_nodes(prog) if alpha else (), alpha_objective,
                exact)
      dense = [t for t in targets if t not in exact and t not in plans]
      chunk = chunk_size or _auto_chunk(prog, dense, ancestors, memory_bytes,
                                        max(map(windows_bytes, plans.values()), default=0),
                                        _live_factor(prog, sound))
      return ctx, [v for v in values if is_interval(v)], chunk

    def bounds(self, share: float, nested: bool):
      """The compiled numeric part for ``share``; ``nested``: called under an outer trace
      (plain ``jax.jit``, inlined there), else `boundjax.core.compile.jit` (its CPU options)."""
      if (share, nested) not in self.by_share:
        def compute(values, spec_arr, packed):
          """The numeric part, one XLA program (inlined when already under jit)."""
          ctx, box_list, chunk = self.context(values, share)
          if self.axes is None:
            outs = run_backward(ctx, box_list, spec_arr, packed)
          else:
            outs = _batched(ctx, box_list, [self.axes[i] for i in self.boxes_idx],
                            self.n_batch, self.batch_axis, chunk, spec_arr, packed)
          info = None
          if return_info:
            outs, info = outs
          outs = [o if o is not None else read_value(ctx.cenv, v)
                  for v, o in zip(self.prog.outvars, outs)]
          return (outs, info) if return_info else outs
        self.by_share[(share, nested)] = (jax.jit if nested else jit)(compute)
      return self.by_share[(share, nested)]

    def screen(self, values, packed):
      if self.screen_fn is None:
        def share_of(values, packed):
          ctx, box_list, chunk = self.context(values, 1.0)
          if self.axes is None:
            return unstable_fraction(ctx, box_list, packed)
          return _batched_share(ctx, box_list, [self.axes[i] for i in self.boxes_idx],
                                self.n_batch, chunk, packed)
        self.screen_fn = jax.jit(share_of)  # outside jit only (``"auto"``): a cheap pass
      return self.screen_fn(values, packed)

  return bounded


def _traced(*trees) -> bool:
  """Whether any leaf is a tracer (the call is under an outer ``jax.jit``, ``vmap``, ...)."""
  return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(trees))


def _precision(sound: bool):
  """``precision=HIGHEST`` for every product traced in sound mode (no TF32 on accelerators)."""
  return jax.default_matmul_precision("highest" if sound else None)


def _spec_target(prog: CrownProgram, spec, n_batch: int | None):
  """The output a ``spec`` applies to (the one box-dependent float output), checked against the
  spec's shape; None without a spec."""
  if spec is None:
    return None
  outs = [v for v in prog.outvars if isinstance(v, _Var) and v in prog.abstract]
  if len(outs) != 1 or not is_float(outs[0].aval) or low_precision(outs[0].aval):
    raise ValueError(f"crown: spec needs fn to have exactly one box-dependent float32/float64 "
                     f"output, got {len(outs)}")
  v = outs[0]
  if spec.shape[-1] != v.size:
    raise ValueError(f"crown: spec has {spec.shape[-1]} columns but the output has {v.size} "
                     "entries per example")
  if spec.ndim == 3 and spec.shape[0] != n_batch:
    raise ValueError(f"crown: per-example spec has {spec.shape[0]} rows of the batch, the boxes "
                     f"have {n_batch}")
  return v


def _check_examples_independent(fn: Callable, arguments: prog_lib.Arguments, axes: dict,
                                batch_axis: int) -> None:
  """With ``batch_axis`` set, every box leaf is split into examples and ``fn`` is bounded per
  example. That is sound only if ``fn`` on the whole batch equals ``fn`` applied to each example
  (an interval *parameter* whose length happens to equal the batch size is not a batch). Checked
  at a random point of the boxes (concrete leaves as given): a difference raises."""
  key = jax.random.PRNGKey(0)
  values = []
  for n, i in enumerate(arguments.dynamic_index):
    leaf = arguments.leaves[i]
    if arguments.kinds[i] == "box":
      t = jax.random.uniform(jax.random.fold_in(key, n), leaf.shape, leaf.dtype)
      values.append(leaf.lower + t * (leaf.upper - leaf.lower))
    else:
      values.append(leaf)
  box_pos = [n for n, i in enumerate(arguments.dynamic_index) if arguments.kinds[i] == "box"]
  box_axes = [axes[arguments.dynamic_index[n]] for n in box_pos]

  def call(vals):
    a, k = arguments.rebuild(vals)
    return jax.tree_util.tree_leaves(fn(*a, **k))

  def per_example(*boxes):
    vals = list(values)
    for n, b, ax in zip(box_pos, boxes, box_axes):
      vals[n] = jnp.expand_dims(b, ax)
    return call(vals)

  whole = call(values)
  split = jax.vmap(per_example, in_axes=tuple(box_axes))(*[values[n] for n in box_pos])
  for w, s in zip(whole, split):
    w, s = jnp.asarray(w), jnp.asarray(s)
    if not jnp.issubdtype(w.dtype, jnp.floating):
      continue
    nd = w.ndim
    ax = batch_axis % nd if nd else 0
    if nd == 0 or s.ndim != nd + 1 or s.shape[1 + ax] != 1:
      continue  # not split per example: reported by the batched pass itself
    s = jnp.squeeze(jnp.moveaxis(s, 0, ax), ax + 1)
    tol = 1e-4 * (1 + jnp.max(jnp.abs(w))) if w.size else 0
    if s.shape != w.shape or bool(jnp.max(jnp.abs(s - w)) > tol):
      raise BoundError(
          f"bj.crown: with batch_axis={batch_axis} every Interval leaf is split into "
          f"examples along that axis, but fn on the whole batch differs from fn applied to "
          f"each example (e.g. an interval parameter whose length equals the batch size, or a "
          f"layer mixing examples). Use batch_axis=None to bound the call as one problem.")


def _cache_key(leaves, treedef, dyn):
  """Hashable description of a call (structure, shapes, dtypes, static leaves), or None."""
  dyn_set = set(dyn)
  parts = []
  for i, l in enumerate(leaves):
    if i in dyn_set:
      if isinstance(l, jax.core.Tracer) or (is_interval(l) and isinstance(l.lower,
                                                                          jax.core.Tracer)):
        return None  # under an outer trace: nothing to gain
      parts.append((is_interval(l), jnp.shape(l.lower if is_interval(l) else l),
                    str(jnp.result_type(l.lower if is_interval(l) else l))))
    else:
      parts.append(("static", l))
  key = (treedef, tuple(parts))
  try:
    hash(key)
  except TypeError:
    return None
  return key


def _live_factor(prog: CrownProgram, sound: bool) -> float:
  """Bytes alive per example, in units of the largest backward state (`_lambda_bytes`): 3 (its
  two bounds' temporaries), twice that in sound mode (the ``|Λ|`` of every slack) and 2.5 times
  more with logistic/tanh relaxations (per-row lines and tangent points). Measured with
  ``bj.crown(batch_axis=0)`` on VNN-COMP 2021's ERAN networks, batches of 8 and 128 boxes,
  float64: ReLU 9x200 7.5 MB per example in float mode (the estimate), 13 MB in sound mode;
  sigmoid 6x200 17 MB and 34 MB."""
  s_shaped = any(e.kind == "nonlinear" and e.name in S_SHAPED for e in prog.eqns)
  return 3.0 * (2.0 if sound else 1.0) * (2.5 if s_shaped else 1.0)


def _even_chunk(chunk: int, n: int) -> int:
  """The chunk size that splits ``n`` examples into as many chunks as ``chunk`` needs, of equal
  sizes where possible (128 with at most 71 per chunk: 2 x 64, not 71 + 57, whose remainder
  is a second compiled body)."""
  chunk = max(1, min(chunk, n))
  parts = -(-n // chunk)
  return -(-n // parts)


def _auto_chunk(prog, targets, ancestors, memory_bytes, windowed: int = 0,
                live: float = 3.0) -> int:
  """Examples per chunk: the largest dense backward state of ``targets`` (or ``windowed``,
  the largest windowed pass's state, `windows_bytes`) ``live`` times per example
  (`_live_factor`), plus one strided convolution's temporaries (`_temporary_bytes`), within
  ``memory_bytes``; `MemoryBudgetError` when one example's state does not fit three times.

  The temporaries size the chunks but do not refuse a single example: they live for one
  layer's transpose, and refusing them made the verifier fall back to interval bounds on
  CIFAR10-ResNet 4b (VNN-COMP 2021), whose CROWN bound it proves within its 4 GB (3.3 GB
  peak measured) when they are allowed."""
  per = max(_lambda_bytes(prog, targets, ancestors), windowed, 1)
  if 3 * per > memory_bytes:
    raise MemoryBudgetError(
        f"crown: one example's backward state needs about {3 * per / 2**20:.2f} MiB "
        f"({3 * per} bytes), more than memory_bytes={memory_bytes / 2**20:.2f} MiB "
        f"({memory_bytes} bytes); raise memory_bytes, use intermediate='ibp' (CROWN-IBP), or "
        "bound fewer outputs with spec=.", 3 * per, memory_bytes)
  temps = _temporary_bytes(prog, targets, ancestors)
  return max(1, int(memory_bytes // (live * per + temps)))


def _check_box(iv: Interval) -> None:
  if jnp.shape(iv.lower) != jnp.shape(iv.upper):
    raise ValueError(f"crown: Interval argument has lower shape {jnp.shape(iv.lower)} but upper "
                     f"shape {jnp.shape(iv.upper)}.")
  for name, a in (("lower", iv.lower), ("upper", iv.upper)):
    if not jnp.issubdtype(jnp.result_type(a), jnp.floating):
      raise ValueError(f"crown: Interval {name} bound must be floating point, got "
                       f"{jnp.result_type(a)}.")
  if jnp.result_type(iv.lower) != jnp.result_type(iv.upper):
    raise ValueError(f"crown: Interval argument has lower dtype {jnp.result_type(iv.lower)} but "
                     f"upper dtype {jnp.result_type(iv.upper)}.")


def _batch_axes(leaves, boxes_idx, batch_axis):
  if batch_axis is None:
    return None
  axes, sizes = {}, {}
  for i in boxes_idx:
    nd = leaves[i].ndim
    if not -nd <= batch_axis < nd:
      raise ValueError(f"crown: batch_axis={batch_axis} is out of range for an Interval "
                       f"argument of shape {leaves[i].shape}; use batch_axis=None for "
                       "unbatched inputs.")
    axes[i] = batch_axis % nd
    sizes[i] = leaves[i].shape[axes[i]]
  if len(set(sizes.values())) > 1:
    raise ValueError(f"crown: Interval arguments disagree on the batch size along axis "
                     f"{batch_axis}: {sorted(set(sizes.values()))}.")
  if next(iter(sizes.values())) == 0:
    raise ValueError("crown: empty batch.")
  return axes


def _rounded_share(share) -> float:
  """A measured share of unstable neurons rounded up to a power of two (at least 1/64), so few
  programs are compiled."""
  share = float(share)
  return 1.0 if share > 0.5 else max(2.0 ** math.ceil(math.log2(max(share, 1e-9))), 1 / 64)


def _batched_share(ctx: Ctx, boxes, axes, n_batch: int, chunk: int, data=None):
  """`unstable_fraction`'s largest value over the batch."""
  los = [jnp.moveaxis(b.lower, a, 0) for b, a in zip(boxes, axes)]
  his = [jnp.moveaxis(b.upper, a, 0) for b, a in zip(boxes, axes)]

  def one(xs):
    lo, hi, dt = xs
    ex = [Interval(jnp.expand_dims(l, a), jnp.expand_dims(h, a), validate=False)
          for l, h, a in zip(lo, hi, axes)]
    return unstable_fraction(ctx, ex, dt)

  return jnp.max(lax.map(one, (los, his, data), batch_size=_even_chunk(chunk, n_batch)))


def _batched(ctx: Ctx, boxes, axes, n_batch: int, batch_axis: int, chunk: int, spec=None,
             data=None):
  """Runs the per-example pass over the batch (lax.map over vmapped chunks). ``spec``: None,
  one (k, m) matrix for every example, or (batch, k, m) (row i of the batch gets ``spec[i]``)."""
  los = [jnp.moveaxis(b.lower, a, 0) for b, a in zip(boxes, axes)]
  his = [jnp.moveaxis(b.upper, a, 0) for b, a in zip(boxes, axes)]
  per_example = spec is not None and spec.ndim == 3
  specs = spec if per_example else jnp.zeros((n_batch, 0))

  def one(xs):
    lo, hi, sp, dt = xs
    ex = [Interval(jnp.expand_dims(l, a), jnp.expand_dims(h, a), validate=False)
          for l, h, a in zip(lo, hi, axes)]
    outs = run_backward(ctx, ex, sp if per_example else spec, dt)
    info = None
    if ctx.info:
      outs, info = outs
    return [None if o is None else (o.lower, o.upper) for o in outs], info

  if n_batch == 1:
    stacked, info = jax.tree_util.tree_map(
        lambda a: a[None], one(([l[0] for l in los], [h[0] for h in his], specs[0],
                                jax.tree_util.tree_map(lambda a: a[0], data))))
  else:
    stacked, info = lax.map(one, (los, his, specs, data), batch_size=_even_chunk(chunk, n_batch))
  outs = []
  for o in stacked:
    if o is None:
      outs.append(None)
      continue
    lo, hi = o
    nd = lo.ndim - 1
    ax = batch_axis % nd if nd else 0
    if nd == 0 or lo.shape[1 + ax] != 1:
      raise ValueError(
          f"crown: with batch_axis={batch_axis}, every box-dependent output must keep a batch "
          f"axis of size 1 when fn is called on one example; got shape {lo.shape[1:]}. Use "
          "batch_axis=None if fn mixes examples.")
    lo = jnp.squeeze(jnp.moveaxis(lo, 0, ax), ax + 1)
    hi = jnp.squeeze(jnp.moveaxis(hi, 0, ax), ax + 1)
    outs.append(Interval(lo, hi, validate=False))
  return (outs, info) if ctx.info else outs


# ----------------------------------------------------------------------------------------------
# Split constraints (β-CROWN sub-problems) and the details returned with ``return_info``
# ----------------------------------------------------------------------------------------------

class CrownInfo(NamedTuple):
  """Details of `crown`'s bounds of the one box-dependent output (``return_info=True``), one
  entry per ReLU node (see ``splits``) or per box input; arrays carry the batch axis first when
  ``batch_axis=0``. ``k``: the rows of the bounds (``spec``'s, or the flattened output).

  Attributes:
    pre: ``(lo, hi)`` per node, (n,) each: the bounds of the node's input used by the relaxation
      (met with ``pre`` and clipped by ``splits``); with ``alpha_intermediate``, those of the
      final pass (the optimised slopes' bounds met with CROWN's), the tightest computed.
    infeasible: True where the split constraints are unsatisfiable on the box (empty bounds).
    alpha: (2, k, n) per node: the lower ReLU slopes of the lower rows ([0]) and the upper rows
      ([1]) of the returned bounds' last pass (CROWN's adaptive slopes without optimisation).
    beta: (2, k, n) per node: the split multipliers (zeros without ``beta``).
    relu_coeffs: (k, n) per node: coefficients ``Λ`` of the lower bounds on the node's output
      ``max(z, c)`` (``min(z, c)``).
    input_coeffs: (k, size) per box input: the lower bounds' coefficients on the (flattened)
      input; the bound's minimiser over the box is the corner ``lower`` where ``Λ > 0``,
      ``upper`` elsewhere.
  """

  pre: tuple
  infeasible: Any
  alpha: tuple
  beta: tuple
  relu_coeffs: tuple
  input_coeffs: tuple


def _make_info(info: dict) -> CrownInfo:
  return CrownInfo(tuple(tuple(p) for p in info["pre"]), info["infeasible"],
                   tuple(info["alpha"]), tuple(info["beta"]), tuple(info["relu_coeffs"]),
                   tuple(info["input_coeffs"]))


def _s_nodes(prog: CrownProgram) -> tuple:
  """``(x, equation index)`` of every logistic/tanh equation relaxed by lines (its input
  ``x``): α-CROWN optimises their tangent points (`rules.s_shaped_lines_at`)."""
  return tuple((e.relax_in[0], i) for i, e in enumerate(prog.eqns)
               if e.kind == "nonlinear" and e.mode == "unary" and e.name in S_SHAPED)


def _one_output(prog: CrownProgram):
  outs = [v for v in prog.outvars if isinstance(v, _Var) and v in prog.abstract]
  if len(outs) != 1:
    raise ValueError(f"crown: return_info needs fn to have exactly one box-dependent output, "
                     f"got {len(outs)}")
  return outs[0]


def _pack_data(data, nodes, n_batch):
  """Checks and converts the call's ``splits``/``pre``/``warm`` (see `crown`) into the
  per-node lists `run_backward` reads; None without split constraints."""
  if data is None:
    return None
  lead = () if n_batch is None else (n_batch,)
  n_nodes = len(nodes)

  def per_node(name, value):
    if value is None:
      return [None] * n_nodes
    value = list(value)
    if len(value) != n_nodes:
      raise ValueError(f"crown: {name} needs one entry per ReLU node ({n_nodes}), got "
                       f"{len(value)}")
    return value

  def arr(name, a, x, tail=(), dtype=None):
    a = jnp.asarray(a, dtype)
    want = lead + tail + (x.size,)
    if a.shape != want:
      raise ValueError(f"crown: {name} for a ReLU node of {x.size} entries needs shape {want}, "
                       f"got {a.shape}")
    return a

  out_s = []
  for (x, _), s in zip(nodes, per_node("splits", data["splits"])):
    if s is None:
      out_s.append(None)
      continue
    s = arr("splits", s, x, dtype=jnp.int8 if not isinstance(s, jax.core.Tracer) else None)
    if not isinstance(s, jax.core.Tracer) and not bool(jnp.all(jnp.abs(s) <= 1)):
      raise ValueError("crown: splits must hold -1, 0 or +1")
    out_s.append(s.astype(jnp.int8))
  out_p = []
  for (x, _), p in zip(nodes, per_node("pre", data["pre"])):
    if p is None:
      out_p.append(None)
      continue
    lo, hi = p
    dt = x.aval.dtype
    out_p.append((arr("pre", lo, x, dtype=dt), arr("pre", hi, x, dtype=dt)))
  packed = {"splits": out_s, "pre": out_p}
  if data["warm"] is not None:
    al, be = data["warm"]
    rows = jnp.shape(al[0])[len(lead) + 1] if len(al) else 0
    sides = jnp.shape(al[0])[len(lead)] if len(al) else 2
    if sides not in (1, 2):
      raise ValueError(f"crown: a warm start holds one side or two (lower rows, upper rows), "
                       f"got {sides}")
    packed["alpha"] = [arr("warm alpha", a, x, (sides, rows), x.aval.dtype)
                       for (x, _), a in zip(nodes, per_node("warm alpha", al))]
    packed["beta"] = [arr("warm beta", b, x, (sides, rows), x.aval.dtype)
                      for (x, _), b in zip(nodes, per_node("warm beta", be))]
  return packed
