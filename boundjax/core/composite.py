"""Composite primitives: functions with tight bound rules, recognised by identity.

Interval arithmetic composed through ``exp(x - max x) / Σ exp(x - max x)`` forgets that one logit
appears in numerator and denominator, and the bound blows up. `boundjax.nn` therefore binds
*private primitives* (created here) for softmax, log-softmax, logsumexp and the cross-entropy
losses. A domain's rule table is keyed by primitive, so these get their own rules, and nothing a
user writes can be mistaken for them: a user function named ``log_softmax`` is an ordinary call
whose body is bounded equation by equation.

A primitive made by `define` behaves like the function it wraps under every JAX
transformation: it evaluates and lowers as ``impl``, differentiates with the given JVP (written
with composite primitives again, so gradients keep tight rules), and batches over leading axes
(every composite acts along trailing axes; the batch axis is moved to the front).

`recognise` rewrites a call of ``jax.nn.softmax`` / ``jax.nn.log_softmax`` into the composite
only when the called body is the *same program* as JAX's own function for that shape, dtype and
axis, compared equation by equation (`same_jaxpr`): identity of the computation, never a name.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore
from jax.interpreters import ad, batching, mlir

from boundjax.core.ir import Lit

REGISTRY: dict[str, jcore.Primitive] = {}
BODIES: dict[jcore.Primitive, Callable] = {}
"""The concrete body of every composite, for domains that bound it equation by equation."""


def define(name: str, impl: Callable, jvp: Callable) -> jcore.Primitive:
  """A private primitive ``boundjax_<name>`` computing ``impl(*args, **params)``.

  Args:
    name: short name (the primitive is called ``boundjax_<name>``).
    impl: the concrete semantics, a JAX function of array arguments and static keyword params.
    jvp: ``jvp(primals, tangents, **params) -> (primal_out, tangent_out)``; tangents may be
      `ad.Zero`.
  """
  prim = jcore.Primitive(f"boundjax_{name}")
  prim.def_impl(lambda *args, **params: jax.jit(functools.partial(impl, **params))(*args))

  def abstract_eval(*avals, **params):
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]
    out = jax.eval_shape(functools.partial(impl, **params), *shapes)
    return jax.core.ShapedArray(out.shape, out.dtype)

  prim.def_abstract_eval(abstract_eval)
  mlir.register_lowering(prim, mlir.lower_fun(impl, multiple_results=False))

  def jvp_rule(primals, tangents, **params):
    tangents = [None if type(t) is ad.Zero else t for t in tangents]
    out, t_out = jvp(primals, tangents, **params)
    return out, (ad.Zero.from_primal_value(out) if t_out is None else t_out)

  ad.primitive_jvps[prim] = jvp_rule

  def batch_rule(args, dims, **params):
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    moved = [jnp.broadcast_to(a, (size, *jnp.shape(a))) if d is None
             else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
    return prim.bind(*moved, **params), 0

  batching.primitive_batchers[prim] = batch_rule
  REGISTRY[prim.name] = prim
  BODIES[prim] = impl
  return prim


def negative_axis(axis: int, ndim: int) -> int:
  """``axis`` as a negative index (stays valid when batch axes are added in front)."""
  if not -ndim <= axis < ndim:
    raise ValueError(f"axis {axis} is out of range for an array of rank {ndim}")
  return axis - ndim if axis >= 0 else axis


# ----------------------------------------------------------------------------------------------
# Recognising JAX's own softmax / log_softmax
# ----------------------------------------------------------------------------------------------

def same_jaxpr(a: jcore.Jaxpr, b: jcore.Jaxpr) -> bool:
  """True when two jaxprs are the same program: equal primitives, parameters, literals, avals
  and wiring, equation by equation (callable parameters, e.g. JVP thunks, are compared by
  nothing more than being callable; the body they belong to is compared)."""
  if (len(a.invars) != len(b.invars) or len(a.outvars) != len(b.outvars)
      or len(a.eqns) != len(b.eqns) or len(a.constvars) != len(b.constvars)):
    return False
  env: dict = {}

  def bind_var(x, y) -> bool:
    if x.aval.strip_weak_type() != y.aval.strip_weak_type():
      return False
    env[x] = y
    return True

  def same_atom(x, y) -> bool:
    if isinstance(x, jcore.Literal) or isinstance(y, jcore.Literal):
      return (isinstance(x, jcore.Literal) and isinstance(y, jcore.Literal)
              and np.array_equal(np.asarray(x.val), np.asarray(y.val))
              and np.asarray(x.val).dtype == np.asarray(y.val).dtype)
    return env.get(x) is y

  for x, y in zip(a.constvars + a.invars, b.constvars + b.invars):
    if not bind_var(x, y):
      return False
  for ea, eb in zip(a.eqns, b.eqns):
    if ea.primitive is not eb.primitive or len(ea.invars) != len(eb.invars):
      return False
    if not all(same_atom(x, y) for x, y in zip(ea.invars, eb.invars)):
      return False
    if not _same_params(ea.params, eb.params):
      return False
    if len(ea.outvars) != len(eb.outvars):
      return False
    for x, y in zip(ea.outvars, eb.outvars):
      if not bind_var(x, y):
        return False
  return all(same_atom(x, y) for x, y in zip(a.outvars, b.outvars))


def _same_params(p: dict, q: dict) -> bool:
  if p.keys() != q.keys():
    return False
  for k in p:
    x, y = p[k], q[k]
    if isinstance(x, jcore.ClosedJaxpr) and isinstance(y, jcore.ClosedJaxpr):
      if len(x.consts) or len(y.consts) or not same_jaxpr(x.jaxpr, y.jaxpr):
        return False
    elif isinstance(x, jcore.Jaxpr) and isinstance(y, jcore.Jaxpr):
      if not same_jaxpr(x, y):
        return False
    elif callable(x) and callable(y) and not isinstance(x, (type, np.ufunc)):
      continue
    elif k == "name":
      continue  # the body decides, never the name
    else:
      try:
        if not bool(x == y):
          return False
      except Exception:
        return False
  return True


@functools.lru_cache(maxsize=256)
def _reference_body(fn_name: str, shape: tuple, dtype: str, axis: int):
  fn = {"softmax": jax.nn.softmax, "log_softmax": jax.nn.log_softmax}[fn_name]
  closed = jax.make_jaxpr(functools.partial(fn, axis=axis))(jax.ShapeDtypeStruct(shape, dtype))
  eqns = closed.jaxpr.eqns
  if len(eqns) != 1 or eqns[0].primitive.name not in ("pjit", "jit"):
    return None
  return eqns[0].params["jaxpr"]


def recognise(eqn) -> tuple[jcore.Primitive, dict] | None:
  """``(composite primitive, params)`` when ``eqn`` is a call of JAX's own softmax or
  log_softmax over one axis (same program), else None."""
  if eqn.primitive.name not in ("pjit", "jit") or len(eqn.invars) != 1 or len(eqn.outvars) != 1:
    return None
  body = eqn.params.get("jaxpr")
  if body is None or len(body.consts):
    return None
  aval = eqn.invars[0].aval
  if not jnp.issubdtype(aval.dtype, jnp.floating) or aval.ndim == 0:
    return None
  axes = {e.params.get("axes") for e in body.jaxpr.eqns if e.primitive.name == "reduce_max"}
  for fn_name in ("log_softmax", "softmax"):
    prim = REGISTRY.get(f"boundjax_{fn_name}")   # defined by boundjax.nn
    if prim is None:
      continue
    for ax in axes:
      if ax is None or len(ax) != 1:
        continue
      ref = _reference_body(fn_name, tuple(aval.shape), str(aval.dtype), int(ax[0]))
      if ref is not None and same_jaxpr(body.jaxpr, ref.jaxpr):
        return prim, {"axis": negative_axis(int(ax[0]), aval.ndim)}
  return None


# ----------------------------------------------------------------------------------------------
# Recognising JAX's softmax where it was inlined (jax.nn.softmax has no call boundary)
# ----------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=256)
def _reference_softmax_eqns(shape: tuple, dtype: str, axis: int):
  closed = jax.make_jaxpr(functools.partial(jax.nn.softmax, axis=axis))(
      jax.ShapeDtypeStruct(shape, dtype))
  if len(closed.consts) or any(e.primitive.name in ("pjit", "jit") for e in closed.jaxpr.eqns):
    return None
  return closed.jaxpr


def _atom_matches(a, r, env: dict) -> bool:
  """Does the flat program's operand ``a`` play the role of the reference operand ``r``?"""
  if isinstance(r, jcore.Literal):
    return isinstance(a, Lit) and np.array_equal(np.asarray(a.val), np.asarray(r.val)) and \
        np.asarray(a.val).dtype == np.asarray(r.val).dtype
  return env.get(r) is a


def match_inlined_softmax(eqns: list, start: int):
  """If ``eqns[start:]`` begins with the equations of ``jax.nn.softmax`` (same program as JAX's
  for this shape, dtype and axis), returns ``(length, input, output, axis)``, else None."""
  first = eqns[start]
  if first.prim.name != "reduce_max" or len(first.params.get("axes", ())) != 1:
    return None
  x = first.invars[0]
  aval = getattr(x, "aval", None)
  if aval is None or not jnp.issubdtype(aval.dtype, jnp.floating):
    return None
  axis = int(first.params["axes"][0])
  ref = _reference_softmax_eqns(tuple(aval.shape), str(aval.dtype), axis)
  if ref is None:
    return None
  env = {ref.invars[0]: x}
  # the program layer drops stop_gradient (the identity on values): skip it in the reference too
  alias = {r.outvars[0]: r.invars[0] for r in ref.eqns if r.primitive.name == "stop_gradient"}
  ref_eqns = [r for r in ref.eqns if r.primitive.name != "stop_gradient"]
  if start + len(ref_eqns) > len(eqns):
    return None
  for e, r in zip(eqns[start:start + len(ref_eqns)], ref_eqns):
    r_invars = [alias.get(a, a) if not isinstance(a, jcore.Literal) else a for a in r.invars]
    if e.prim is not r.primitive or len(e.invars) != len(r.invars) or \
        len(e.outvars) != len(r.outvars):
      return None
    if not all(_atom_matches(a, b, env) for a, b in zip(e.invars, r_invars)):
      return None
    if not _same_params(e.params, r.params):
      return None
    for o, ro in zip(e.outvars, r.outvars):
      if o.aval.strip_weak_type() != ro.aval.strip_weak_type():
        return None
      env[ro] = o
  out = env.get(ref.outvars[0])
  if out is None:
    return None
  return len(ref_eqns), x, out, negative_axis(axis, aval.ndim)
