"""The flat program every domain evaluates: variables, literals, equations, and their source lines.

`boundjax.core.program` builds a `Program` from a traced JAX function (every call inlined); the
domains (`boundjax.domains.*`) evaluate its equations with their rule tables.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import numpy as np
from jax._src import source_info_util


# ----------------------------------------------------------------------------------------------
# The flat program
# ----------------------------------------------------------------------------------------------

class Var:
  """A variable of a flat program (fresh for every inlined call)."""
  __slots__ = ("aval", "idx")

  def __init__(self, aval, idx: int):
    self.aval, self.idx = aval, idx

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(self.aval.shape)

  @property
  def dtype(self):
    return self.aval.dtype

  @property
  def size(self) -> int:
    return int(np.prod(self.aval.shape, dtype=np.int64))

  def __repr__(self):
    return f"v{self.idx}{list(self.shape)}"


class Lit:
  """A literal operand."""
  __slots__ = ("val",)

  def __init__(self, val):
    self.val = val

  @property
  def aval(self):
    typeof = getattr(jax, "typeof", None) or jax.core.get_aval   # jax.core.get_aval before 0.5
    return typeof(self.val)

  def __repr__(self):
    return f"Lit({self.val!r})"


@dataclasses.dataclass
class Eqn:
  """One equation of a flat program: ``outvars = prim.bind(*invars, **params)``."""
  prim: Any
  params: dict
  invars: list
  outvars: list
  source_info: Any
  manager: Any  # the context manager of the original equation (e.g. named axes)
  abstract: bool = False  # True when some input depends on a box
  abstract_pos: tuple = ()

  @property
  def name(self) -> str:
    return self.prim.name

  def where(self) -> str:
    """The user's source line of the equation, e.g. ``model.py:12 (__call__)``."""
    return source_line(self.source_info)

  def bind(self, values: Sequence[Any]) -> list:
    """Evaluates the equation on concrete values; always returns a list."""
    bind = self.prim.get_bind_params(self.params)
    subfuns, params = bind if isinstance(bind, tuple) else ((), bind)
    with self.manager:
      out = self.prim.bind(*subfuns, *values, **params)
    return list(out) if self.prim.multiple_results else [out]


@dataclasses.dataclass
class Program:
  """A flat program: inputs, outputs, equations, constants and the box-dependent variables."""
  invars: list
  outvars: list
  eqns: list
  consts: dict
  depends: set
  out_tree: Any = None

  @functools.cached_property
  def producer(self) -> dict:
    return {o: i for i, e in enumerate(self.eqns) for o in e.outvars}

  def primitives(self) -> set[str]:
    """Names of the primitives of the abstract equations."""
    return {e.name for e in self.eqns if e.abstract}


_LIBRARY_DIRS = ("/boundjax/", "/jax/", "/jaxlib/", "/flax/", "/optax/", "/chex/", "/numpy/",
                 "/contextlib.py", "/functools.py")


def source_frame(source_info):
  try:
    tb = source_info.traceback
    for frame in (tb.frames if tb is not None else []):
      if not any(d in frame.file_name for d in _LIBRARY_DIRS):
        return frame
  except Exception:  # pragma: no cover - best effort only
    return None
  return None


ONNX_SCOPE = "onnx:"
"""Prefix of the JAX name scope in which `boundjax.io.onnx` runs each node's converter
(``onnx:Gelu node 'gelu_1'``)."""


def onnx_node(source_info) -> str | None:
  """The ONNX node an equation was converted from (``Gelu node 'gelu_1'``), or None: the
  innermost name scope that starts with `ONNX_SCOPE`."""
  try:
    names = [getattr(s, "name", str(s)) for s in source_info.name_stack.stack]
  except Exception:  # pragma: no cover - best effort only
    return None
  for name in reversed(names):
    if isinstance(name, str) and name.startswith(ONNX_SCOPE):
      return name[len(ONNX_SCOPE):]
  return None


def source_line(source_info) -> str:
  """The user's line of an equation: the innermost frame of its traceback outside boundjax,
  jax, flax, optax and the standard library, e.g. ``model.py:12 (__call__)``; for a model loaded
  by `boundjax.io.load_onnx` followed by the ONNX node, ``... in ONNX Gelu node 'gelu_1'``."""
  node = onnx_node(source_info)
  suffix = "" if node is None else f", in ONNX {node}"
  frame = source_frame(source_info)
  if frame is not None:
    line = getattr(frame, "line_num", None) or getattr(frame, "start_line", "?")
    return f"{frame.file_name}:{line} ({frame.function_name}){suffix}"
  try:
    return (source_info_util.summarize(source_info) or "<unknown location>") + suffix
  except Exception:  # pragma: no cover - best effort only
    return "<unknown location>" + suffix
