"""A jaxpr interpreter over abstract values.

`evaluate` walks a closed jaxpr equation by equation. An equation whose inputs are all concrete
(arrays, tracers of an enclosing transformation) is executed as JAX would execute it, so bounding
costs nothing where nothing is uncertain. An equation with at least one abstract input is handed
to the rule the `Domain` registers for its primitive. Call-like primitives (``jit``,
``custom_jvp_call``, ``custom_vjp_call``, ``closed_call``, ``remat``) are entered recursively,
unless the domain has a *composite* rule for the called function's name (e.g. a tight softmax).

Because the interpreter runs ordinary JAX operations, the result can itself be jitted, vmapped
and differentiated with respect to interval endpoints or concrete parameters.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
from jax._src import source_info_util
from jax.extend import core as jcore

from boundjax.errors import UnsupportedPrimitiveError

# A rule receives the domain context, the abstract-or-concrete inputs and the equation's params,
# and returns one value (or a list when the primitive has multiple results).
Rule = Callable[..., Any]
# A composite rule receives the context, the call's inputs and the called ClosedJaxpr.
CompositeRule = Callable[..., Any]

_CALL_PARAM = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "remat": "jaxpr",
    "checkpoint": "jaxpr",
    "custom_lin": None,
}


@dataclasses.dataclass(frozen=True)
class Domain:
  """An abstract domain: how to recognise its values and a table ``primitive name -> rule``.

  Attributes:
    name: shown in error messages ("interval", "difference", ...).
    is_abstract: predicate recognising the domain's abstract values.
    rules: primitive name -> rule(ctx, *invals, **params).
    composites: called-function name -> rule(ctx, *invals, jaxpr=ClosedJaxpr); consulted for
      ``jit`` calls (and ``custom_jvp``/``custom_vjp`` calls) before entering them.
  """
  name: str
  is_abstract: Callable[[Any], bool]
  rules: Mapping[str, Rule]
  composites: Mapping[str, CompositeRule] = dataclasses.field(default_factory=dict)


def source_line(eqn: jcore.JaxprEqn) -> str:
  """The user's source location of an equation, e.g. ``model.py:12 (__call__)``."""
  try:
    return source_info_util.summarize(eqn.source_info)
  except Exception:  # pragma: no cover - best effort only
    return "<unknown location>"


def _call_name(eqn: jcore.JaxprEqn) -> str | None:
  """Name of the function a call-like equation calls (``jit[name=...]`` or custom_jvp fun)."""
  name = eqn.params.get("name")
  if isinstance(name, str):
    return name
  sub = eqn.params.get(_CALL_PARAM.get(eqn.primitive.name) or "", None)
  jaxpr = getattr(sub, "jaxpr", sub)
  info = getattr(jaxpr, "debug_info", None)
  src = getattr(info, "func_src_info", None) if info is not None else None
  if isinstance(src, str) and src:
    return src.split(" ")[0]
  return None


def _as_closed(sub: Any) -> jcore.ClosedJaxpr:
  if isinstance(sub, jcore.ClosedJaxpr):
    return sub
  return jcore.ClosedJaxpr(sub, ())


def _bind_concrete(eqn: jcore.JaxprEqn, invals: Sequence[Any]) -> list[Any]:
  bind = eqn.primitive.get_bind_params(eqn.params)
  if isinstance(bind, tuple):  # older JAX: (subfuns, params)
    subfuns, params = bind
  else:
    subfuns, params = (), bind
  with eqn.ctx.manager:
    out = eqn.primitive.bind(*subfuns, *invals, **params)
  return list(out) if eqn.primitive.multiple_results else [out]


def evaluate(domain: Domain, ctx: Any, closed: jcore.ClosedJaxpr, *args: Any) -> list[Any]:
  """Evaluates ``closed`` on ``args`` (arrays or the domain's abstract values)."""
  return evaluate_jaxpr(domain, ctx, closed.jaxpr, closed.consts, *args)


def evaluate_jaxpr(domain: Domain, ctx: Any, jaxpr: jcore.Jaxpr, consts: Sequence[Any],
                   *args: Any) -> list[Any]:
  env: dict[Any, Any] = {}

  def read(v):
    return v.val if isinstance(v, jcore.Literal) else env[v]

  def write(v, val):
    if not isinstance(v, jcore.DropVar):
      env[v] = val

  if len(args) != len(jaxpr.invars):
    raise ValueError(f"expected {len(jaxpr.invars)} arguments, got {len(args)}")
  for v, c in zip(jaxpr.constvars, consts):
    write(v, c)
  for v, a in zip(jaxpr.invars, args):
    write(v, a)

  for eqn in jaxpr.eqns:
    invals = [read(v) for v in eqn.invars]
    if not any(domain.is_abstract(x) for x in invals):
      outs = _bind_concrete(eqn, invals)
    else:
      outs = _abstract_eqn(domain, ctx, eqn, invals)
    for v, o in zip(eqn.outvars, outs):
      write(v, o)
  return [read(v) for v in jaxpr.outvars]


def _abstract_eqn(domain: Domain, ctx: Any, eqn: jcore.JaxprEqn, invals: list[Any]) -> list[Any]:
  prim = eqn.primitive.name
  if prim in _CALL_PARAM and prim not in domain.rules:
    name = _call_name(eqn)
    composite = domain.composites.get(name) if name else None
    sub = eqn.params.get(_CALL_PARAM[prim]) if _CALL_PARAM[prim] else None
    if composite is not None and sub is not None:
      out = composite(ctx, *invals, jaxpr=_as_closed(sub))
      if out is not NotImplemented:
        return list(out) if isinstance(out, (list, tuple)) else [out]
    if sub is not None:
      closed = _as_closed(sub)
      n_extra = len(invals) - len(closed.jaxpr.invars)
      return evaluate(domain, ctx, closed, *invals[n_extra:] if n_extra > 0 else invals)
  rule = domain.rules.get(prim)
  if rule is None:
    raise UnsupportedPrimitiveError(
        f"The {domain.name} domain has no rule for primitive '{prim}' (at {source_line(eqn)}). "
        f"Its inputs depend on a bounded argument. Supported primitives: "
        f"{', '.join(sorted(domain.rules))}.")
  try:
    out = rule(ctx, *invals, **eqn.params)
  except UnsupportedPrimitiveError as e:
    raise UnsupportedPrimitiveError(f"{e} (at {source_line(eqn)})") from None
  return list(out) if eqn.primitive.multiple_results else [out]
