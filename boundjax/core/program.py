"""The one program layer: tracing, argument splitting, inlining, dependence marking.

Every domain (interval, linear, difference) sees a user function through this module and only
through it. ``trace(fn, args, kwargs)`` produces a `Program`:

* **Arguments** are flattened into leaves of three kinds (`Arguments`): ``box`` (an `Interval`),
  ``array`` (a concrete array, numpy scalar or tracer of an enclosing transformation) and
  ``static`` (Python scalars, strings, ``None``, anything else: baked into the trace, like a
  ``static_argnum`` of ``jax.jit``). Each box leaf is its own program input, so the same
  `Interval` object passed in two places is two independent variables: identity never decides
  dependence.
* **Inlining.** Every call-like primitive (``pjit``/``jit``, ``closed_call``, ``core_call``,
  ``custom_jvp_call``, ``custom_vjp_call``, ``remat``/``checkpoint``) is replaced by the
  equations of the function it calls, so a `Program` is one flat list of `Eqn` s. The bound of a
  call is the bound of its body, whatever its name.
* **Composites** (tight rules for softmax, log-softmax, cross-entropy, ...) are recognised by
  identity only: they are private primitives that `boundjax.nn` binds (see
  `boundjax.core.composite`), never a function name. A call of ``jax.nn.softmax`` /
  ``jax.nn.log_softmax`` is rewritten to the composite only when its body is *the same program*
  as JAX's own function for that shape and axis (compared equation by equation), so a user
  function called ``log_softmax`` that computes something else is never matched.
* **Dependence.** `Program.depends` holds every variable whose value depends on a box; an
  equation with such an input is *abstract* and goes to the domain's rule for its primitive,
  every other equation is evaluated as JAX would.
* **Sound mode** (``precision_highest=True``): every ``dot_general`` / ``conv_general_dilated``
  gets ``precision=HIGHEST``, so the equations a domain emits never run in TF32/bfloat16 passes on
  an accelerator (the error model of `boundjax.core.rounding` assumes float32 products).

Rewrites that keep the exact semantics: ``mul(a, a)`` of one variable becomes
``integer_pow(a, 2)`` (the bound of a square is tighter than that of a product of two boxes);
``stack``, ``unstack`` and ``tile`` become the concatenations, slices and broadcasts they are
(`DECOMPOSED`).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jcore

from boundjax import nn
from boundjax.core import composite
from boundjax.core.ir import Eqn, Lit, Program, Var, source_frame, source_line  # noqa: F401  (the IR, re-exported)
from boundjax.core.errors import UnsupportedPrimitiveError
from boundjax.core.interval import Interval, is_interval

# Call-like primitives and the parameter holding the called jaxpr.
CALL_PRIMITIVES = {
    "jit": ("jaxpr",),
    "pjit": ("jaxpr",),
    "closed_call": ("call_jaxpr",),
    "core_call": ("call_jaxpr",),
    "custom_jvp_call": ("call_jaxpr", "fun_jaxpr"),
    "custom_vjp_call": ("call_jaxpr", "fun_jaxpr"),
    "custom_vjp_call_jaxpr": ("fun_jaxpr", "call_jaxpr"),
    "remat": ("jaxpr",),
    "remat2": ("jaxpr",),
    "checkpoint": ("jaxpr",),
    "custom_lin": (),
}
BILINEAR = frozenset({"dot_general", "conv_general_dilated"})


def _stack_as_concatenate(*xs: Any, axis: int) -> Any:
  """``stack``: a new axis on each operand, then one ``concatenate``."""
  return lax.concatenate([lax.expand_dims(x, (axis,)) for x in xs], axis)


def _unstack_as_slices(x: Any, *, axis: int) -> list:
  """``unstack``: one slice per index of ``axis``, the axis squeezed."""
  return [lax.index_in_dim(x, i, axis, keepdims=False) for i in range(x.shape[axis])]


def _tile_as_broadcast(x: Any, *, reps: Sequence[int]) -> Any:
  """``tile``: ``x`` broadcast to shape ``(r_0, s_0, r_1, s_1, ...)`` and reshaped to
  ``(r_0 s_0, r_1 s_1, ...)`` (row-major order repeats the whole block along each axis)."""
  shape = [d for r, n in zip(reps, x.shape) for d in (int(r), n)]
  wide = lax.broadcast_in_dim(x, shape, tuple(range(1, 2 * x.ndim, 2)))
  return lax.reshape(wide, tuple(int(r) * n for r, n in zip(reps, x.shape)))


DECOMPOSED = {"stack": _stack_as_concatenate, "unstack": _unstack_as_slices,
              "tile": _tile_as_broadcast}
"""Primitives that the program layer replaces by the same function written with older
primitives (``jnp.stack``, ``jnp.unstack`` and ``jnp.tile`` bind these since JAX 0.7), so every
domain and the MILP encoder handle them with the rules they already have: data movement, exact."""


def _decomposition(e) -> Any:
  """The closed jaxpr of `DECOMPOSED`'s function for the equation ``e`` (its operands' avals)."""
  fn = functools.partial(DECOMPOSED[e.primitive.name], **e.params)
  args = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in e.invars]
  return jax.make_jaxpr(fn)(*args)


# ----------------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------------

def is_array_like(x: Any) -> bool:
  """A leaf that becomes a program input: arrays, numpy scalars and tracers (not Python
  scalars, which are static)."""
  return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.core.Tracer))


@dataclasses.dataclass
class Arguments:
  """A call's arguments split into leaves.

  Attributes:
    leaves: every pytree leaf of ``(args, kwargs)`` (Intervals are leaves).
    treedef: the structure to rebuild them.
    kinds: per leaf, "box", "array" or "static".
  """
  leaves: list
  treedef: Any
  kinds: list

  @property
  def dynamic_index(self) -> list[int]:
    return [i for i, k in enumerate(self.kinds) if k != "static"]

  @property
  def dynamic(self) -> list:
    return [self.leaves[i] for i in self.dynamic_index]

  @property
  def boxes(self) -> list[Interval]:
    return [l for l, k in zip(self.leaves, self.kinds) if k == "box"]

  def rebuild(self, values: Sequence[Any]):
    """``(args, kwargs)`` with the dynamic leaves replaced by ``values``."""
    new = list(self.leaves)
    for i, v in zip(self.dynamic_index, values):
      new[i] = v
    return jax.tree_util.tree_unflatten(self.treedef, new)

  def cache_key(self):
    """A hashable description (structure, shapes, dtypes, static values), or None."""
    parts = []
    for leaf, kind in zip(self.leaves, self.kinds):
      if kind == "static":
        parts.append(("static", type(leaf), leaf))
        continue
      a = leaf.lower if kind == "box" else leaf
      if isinstance(a, jax.core.Tracer):
        return None
      parts.append((kind, tuple(jnp.shape(a)), str(jnp.result_type(a))))
    key = (self.treedef, tuple(parts))
    try:
      hash(key)
    except TypeError:
      return None
    return key


def split_arguments(args: tuple, kwargs: dict) -> Arguments:
  """Flattens ``(args, kwargs)`` into box, array and static leaves."""
  leaves, treedef = jax.tree_util.tree_flatten((args, kwargs), is_leaf=is_interval)
  kinds = ["box" if is_interval(l) else "array" if is_array_like(l) else "static"
           for l in leaves]
  return Arguments(leaves, treedef, kinds)


def _called_jaxpr(eqn) -> Any:
  keys = CALL_PRIMITIVES.get(eqn.primitive.name)
  if keys is None:
    return None
  for key in keys:
    sub = eqn.params.get(key)
    if isinstance(sub, (jcore.ClosedJaxpr, jcore.Jaxpr)):
      return sub
  return None


def flatten(closed: jcore.ClosedJaxpr, *, recognise: Callable | None = None) -> Program:
  """Inlines every call of ``closed`` into one flat `Program` (dependence not yet marked).

  ``recognise(eqn) -> (primitive, params) | None`` may replace a call by a composite primitive
  (see `boundjax.core.composite.recognise`).
  """
  counter = [0]
  eqns: list[Eqn] = []
  consts: dict = {}

  def fresh(aval):
    counter[0] += 1
    return Var(aval, counter[0])

  def inline(jaxpr, const_vals, in_atoms, caller_info=None):
    # equations of a cached inner trace (e.g. jnp functions that are jitted) carry no frame of
    # the user's code: they take their caller's source info
    env = {}
    for v, c in zip(jaxpr.constvars, const_vals):
      nv = fresh(v.aval)
      consts[nv] = c
      env[v] = nv
    for v, a in zip(jaxpr.invars, in_atoms):
      env[v] = a

    def read(a):
      return Lit(a.val) if isinstance(a, jcore.Literal) else env[a]

    for e in jaxpr.eqns:
      ins = [read(a) for a in e.invars]
      info = e.source_info
      if caller_info is not None and source_frame(info) is None:
        info = caller_info
      replaced = recognise(e) if recognise is not None else None
      if replaced is not None:
        prim, params = replaced
        outs = [fresh(v.aval) for v in e.outvars]
        eqns.append(Eqn(prim, params, ins, outs, info, e.ctx.manager))
      else:
        sub = _called_jaxpr(e)
        if sub is not None:
          sj, sc = (sub.jaxpr, sub.consts) if isinstance(sub, jcore.ClosedJaxpr) else (sub, ())
          extra = len(ins) - len(sj.invars)
          outs = inline(sj, sc, ins[extra:] if extra > 0 else ins, info)
        elif e.primitive.name in DECOMPOSED:
          sub = _decomposition(e)
          outs = inline(sub.jaxpr, sub.consts, ins, info)
        elif e.primitive.name == "stop_gradient":
          # the identity on values (any differentiation inside fn is already traced); dropping
          # it keeps domains that transpose equations (CROWN's vjp) from reading its zero
          # derivative as a zero map
          outs = ins[:1]
        elif e.primitive.name in CALL_PRIMITIVES:
          raise UnsupportedPrimitiveError(
              f"call primitive '{e.primitive.name}' carries no jaxpr boundjax can inline "
              f"(at {source_line(info)})")
        else:
          outs = [fresh(v.aval) for v in e.outvars]
          prim, params = e.primitive, dict(e.params)
          if prim is lax.mul_p and ins[0] is ins[1] and isinstance(ins[0], Var):
            prim, params, ins = lax.integer_pow_p, {"y": 2}, ins[:1]
          eqns.append(Eqn(prim, params, ins, outs, info, e.ctx.manager))
      for v, o in zip(e.outvars, outs):
        if not isinstance(v, jcore.DropVar):
          env[v] = o
    return [read(a) for a in jaxpr.outvars]

  invars = [fresh(v.aval) for v in closed.jaxpr.invars]
  outvars = inline(closed.jaxpr, closed.consts, invars)
  program = Program(invars, outvars, eqns, consts, set())
  if recognise is not None:
    program = recognise_inlined_softmax(program)
  return eliminate_dead_code(program)


def recognise_inlined_softmax(program: Program) -> Program:
  """Gives the output of every inlined ``jax.nn.softmax`` (its equations, equal to JAX's own
  program, see `composite.match_inlined_softmax`) to the softmax composite instead. Its
  intermediate equations stay (other equations may read them) and go if dead."""
  eqns = list(program.eqns)
  i = 0
  while i < len(eqns):
    found = composite.match_inlined_softmax(eqns, i)
    if found is None:
      i += 1
      continue
    length, x, out, axis = found
    last = eqns[i + length - 1]
    eqns[i + length - 1] = Eqn(nn.softmax_p, {"axis": axis}, [x], [out], last.source_info,
                               last.manager)
    i += length
  program.eqns = eqns
  return program


def eliminate_dead_code(program: Program) -> Program:
  """Drops equations none of whose outputs is used (no JAX primitive bound here has effects
  that matter to a bound)."""
  live = {a for a in program.outvars if isinstance(a, Var)}
  kept = []
  for e in reversed(program.eqns):
    if any(o in live for o in e.outvars) or e.prim.name in _EFFECTFUL:
      kept.append(e)
      live.update(a for a in e.invars if isinstance(a, Var))
  program.eqns = kept[::-1]
  program.consts = {v: c for v, c in program.consts.items() if v in live}
  return program


_EFFECTFUL = frozenset({"debug_callback", "io_callback", "pure_callback"})


def mark_dependence(program: Program, box_inputs: Sequence[bool]) -> Program:
  """Marks every variable that depends on a box input and every equation reading one."""
  depends = {v for v, b in zip(program.invars, box_inputs) if b}
  for e in program.eqns:
    pos = tuple(i for i, a in enumerate(e.invars) if isinstance(a, Var) and a in depends)
    e.abstract, e.abstract_pos = bool(pos), pos
    if pos:
      depends.update(e.outvars)
  program.depends = depends
  return program


def relu_nodes(program: Program) -> tuple:
  """``(z, index of its first ReLU equation)`` of every distinct box-dependent input ``z`` of a
  ReLU-like equation ``max(z, c)`` / ``min(z, c)`` (one box-dependent float operand of two:
  ``jax.nn.relu``, ``jnp.maximum(z, 0)``, clips), in program order: the nodes of ``bj.crown``'s
  ``splits``/``pre`` and of ``bj.difference``'s ``known``, both read from here. Any program whose
  equations have ``name``, ``invars`` and ``abstract_pos`` (set by `mark_dependence`, or by
  CROWN's classification on its own view of the program)."""
  seen, nodes = set(), []
  for i, e in enumerate(program.eqns):
    if e.name not in ("max", "min") or len(e.invars) != 2 or len(e.abstract_pos) != 1:
      continue
    z = e.invars[e.abstract_pos[0]]
    if jnp.issubdtype(z.aval.dtype, jnp.floating) and z not in seen:
      seen.add(z)
      nodes.append((z, i))
  return tuple(nodes)


def highest_precision(program: Program) -> Program:
  """Sets ``precision=HIGHEST`` on every matrix product and convolution (sound modes)."""
  highest = (lax.Precision.HIGHEST, lax.Precision.HIGHEST)
  for e in program.eqns:
    if e.name in BILINEAR:
      e.params = {**e.params, "precision": highest}
  return program


def trace(fn: Callable, arguments: Arguments, *, box_shape: Callable | None = None,
          precision_highest: bool = False) -> Program:
  """Traces ``fn`` on stand-ins of the dynamic leaves and returns its flat `Program`.

  Args:
    fn: the user's function.
    arguments: `split_arguments` of the call.
    box_shape: optional ``(leaf_index, shape) -> shape`` for box stand-ins (CROWN traces one
      example of a batch).
    precision_highest: force ``precision=HIGHEST`` on products (every sound mode).
  """

  def stand_in(i):
    leaf, kind = arguments.leaves[i], arguments.kinds[i]
    a = leaf.lower if kind == "box" else leaf
    shape = tuple(jnp.shape(a))
    if kind == "box" and box_shape is not None:
      shape = box_shape(i, shape)
    return jax.ShapeDtypeStruct(shape, jnp.result_type(a))

  def flat_fn(*values):
    a, k = arguments.rebuild(values)
    return fn(*a, **k)

  index = arguments.dynamic_index
  closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*[stand_in(i) for i in index])
  program = flatten(closed, recognise=composite.recognise)
  program.out_tree = jax.tree_util.tree_structure(out_shape)
  mark_dependence(program, [arguments.kinds[i] == "box" for i in index])
  if precision_highest:
    highest_precision(program)
  return program


# ----------------------------------------------------------------------------------------------
# Forward evaluation over a domain
# ----------------------------------------------------------------------------------------------

def read(env: dict, a: Any) -> Any:
  return a.val if isinstance(a, Lit) else env[a]


def evaluate(program: Program, inputs: Sequence[Any], abstract_eqn: Callable[[Eqn, list], list],
             env: dict | None = None) -> list:
  """Walks ``program`` forwards.

  Concrete equations are evaluated as JAX would; ``abstract_eqn(eqn, invals) -> outvals`` handles
  every equation that reads a box-dependent value (its inputs may be arrays or the domain's
  abstract values).
  """
  env = dict(program.consts) if env is None else env
  for v, a in zip(program.invars, inputs):
    env[v] = a
  for e in program.eqns:
    invals = [read(env, a) for a in e.invars]
    outs = abstract_eqn(e, invals) if e.abstract else e.bind(invals)
    for v, o in zip(e.outvars, outs):
      env[v] = o
  return [read(env, a) for a in program.outvars]


def evaluate_concrete(program: Program, inputs: Sequence[Any]) -> dict:
  """Values of every variable that does not depend on a box (box inputs may be None)."""
  env = dict(program.consts)
  for v, a in zip(program.invars, inputs):
    if v not in program.depends:
      env[v] = a
  for e in program.eqns:
    if e.abstract:
      continue
    for v, o in zip(e.outvars, e.bind([read(env, a) for a in e.invars])):
      env[v] = o
  return env


def unsupported(domain: str, eqn: Eqn, supported: Iterable[str], hint: str = "") -> \
    UnsupportedPrimitiveError:
  """The error for a primitive a domain has no rule for, naming the user's line."""
  msg = (f"The {domain} domain has no rule for primitive '{eqn.name}' (at {eqn.where()}); "
         f"its inputs depend on a bounded argument.")
  if hint:
    msg += " " + hint
  msg += f" Supported primitives: {', '.join(sorted(supported))}."
  return UnsupportedPrimitiveError(msg)


def expand(eqn: Eqn, box_inputs: Sequence[bool], *, precision_highest: bool = False) -> Program:
  """The body of a composite equation as its own flat `Program` (for a domain without a rule for
  the composite, or whose rule declined)."""
  body = composite.BODIES[eqn.prim]
  avals = [a.aval for a in eqn.invars]
  shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]
  closed = jax.make_jaxpr(functools.partial(body, **eqn.params))(*shapes)
  program = flatten(closed, recognise=None)
  mark_dependence(program, box_inputs)
  if precision_highest:
    highest_precision(program)
  return program


def output_origin(program: Program | None, i: int) -> str:
  """Where output ``i`` of ``program`` comes from: ``" (primitive 'add' at model.py:12 (f))"``,
  or ``""`` when unknown (an input passed through, or no program)."""
  if program is None or i >= len(program.outvars):
    return ""
  v = program.outvars[i]
  for e in reversed(program.eqns):
    if any(o is v for o in e.outvars):
      return f" (primitive '{e.name}' at {e.where()})"
  return ""


def _nan_free(iv: Interval, check: Callable[[Any], Any], describe: Callable[[], str],
              guaranteed: bool = False) -> Interval:
  """One returned box through the NaN check: under tracing (values unknown) NaN ends widen to
  ``-inf`` / ``+inf``, which is sound, unless the domain ``guaranteed`` none; a concrete NaN
  raises `BoundError` (``describe()``)."""
  from boundjax.core.errors import BoundError
  lo, hi = iv.lower, iv.upper
  if isinstance(lo, jax.core.Tracer) or isinstance(hi, jax.core.Tracer):
    if guaranteed:
      return iv
    return Interval(jnp.where(jnp.isnan(lo), -jnp.inf, lo), jnp.where(jnp.isnan(hi), jnp.inf, hi),
                    validate=False)
  bad = jnp.isnan(lo) | jnp.isnan(hi)
  if bool(jnp.any(bad)):
    first = tuple(int(k) for k in np.argwhere(np.asarray(bad))[0])
    raise BoundError(f"{describe()} has a NaN bound at index {first} ({int(jnp.sum(bad))} NaN "
                     "entries). No rule may return NaN: this is a boundjax bug, please report it "
                     "with the function.")
  check(iv)
  return iv


def check_outputs(outs: list, *, where: str, program: Program | None = None,
                  nan_free: bool = False) -> list:
  """The last line of defence of every transformation: no NaN in a returned bound.

  A concrete NaN endpoint raises `BoundError` naming the output, the primitive that produced it
  and the user's line (`output_origin`); under tracing (values unknown) NaN endpoints are
  widened to ``-inf`` / ``+inf``, which is sound, unless ``nan_free`` (the domain guards every
  box it builds, e.g. `boundjax.domains.interval.evaluate`: a second element-wise pass over
  every returned box costs as much as a cheap rule). `Interval` leaves and the `Interval` fields of
  other returned objects (e.g. a `DiffInterval`'s ``ref``, ``other``, ``delta``) are checked.
  A bound wider than `WIDE` on a finite box warns."""
  checked = []
  for i, o in enumerate(outs):
    origin = output_origin(program, i)

    def warn_wide(iv: Interval, i=i, origin=origin):
      width = float(jnp.max(iv.upper - iv.lower)) if jnp.size(iv.lower) else 0.0
      if width > WIDE:
        warnings.warn(
            f"{where}: output {i}{origin} has bounds up to {width:.3g} wide (> {WIDE:.0e}) on a "
            "finite box; the box may be too large for this function, or a step is bounded "
            "loosely (bj.crown is tighter for networks).", stacklevel=6)

    def one(iv: Interval, field: str = "") -> Interval:
      if not jnp.issubdtype(jnp.result_type(iv.lower), jnp.floating):
        return iv
      return _nan_free(iv, warn_wide if not field else (lambda _: None),
                       lambda: f"{where}: output {i}{field}{origin}", nan_free)

    if isinstance(o, Interval):
      o = one(o)
    elif o is not None and not is_array_like(o) and hasattr(o, "tree_flatten"):
      children, aux = o.tree_flatten()
      names = getattr(type(o), "__slots__", ())
      children = [one(c, f".{names[k]}" if k < len(names) else f"[{k}]")
                  if isinstance(c, Interval) else c for k, c in enumerate(children)]
      o = type(o).tree_unflatten(aux, children)
    checked.append(o)
  return checked


WIDE = 1e6
"""Width above which a returned bound on a finite box emits a warning."""


def inline_composites(program: Program, keep: Iterable[str] = ()) -> Program:
  """Replaces every composite equation whose primitive name is not in ``keep`` by the equations
  of its body (for domains without a rule for it); dependence is marked again."""
  keep = set(keep)
  if not any(e.prim in composite.BODIES and e.name not in keep for e in program.eqns):
    return program
  eqns: list[Eqn] = []
  consts = dict(program.consts)
  for e in program.eqns:
    if e.prim not in composite.BODIES or e.name in keep:
      eqns.append(e)
      continue
    body = expand(e, [isinstance(a, Var) and a in program.depends for a in e.invars])
    if not all(isinstance(o, Var) and o not in body.invars for o in body.outvars):
      raise UnsupportedPrimitiveError(f"composite '{e.name}' cannot be inlined")
    rename = {**dict(zip(body.invars, e.invars)), **dict(zip(body.outvars, e.outvars))}
    consts.update(body.consts)
    sub = lambda a: rename.get(a, a) if isinstance(a, Var) else a
    for be in body.eqns:
      eqns.append(dataclasses.replace(be, invars=[sub(a) for a in be.invars],
                                      outvars=[sub(a) for a in be.outvars],
                                      source_info=e.source_info))
  new = Program(program.invars, program.outvars, eqns, consts, set(), program.out_tree)
  return mark_dependence(new, [v in program.depends for v in program.invars])
