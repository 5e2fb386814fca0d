"""Validation of the arguments of boundjax transformations, and the checks behind `Interval`.

``bj.ibp``, ``bj.crown`` and ``bj.difference`` call `validate_arguments` on the flattened
arguments before tracing, so that a malformed box fails loudly instead of producing NaN or
unsound bounds. A box ``[l, u]`` is valid when

  shape(l) == shape(u),  dtype(l) == dtype(u) (not complex, bool never mixed with numbers),
  l and u contain no NaN and no ±inf,  and  l <= u element-wise.

Every check runs on the host (numpy) and only on concrete values: tracers (inside ``jit``,
``vmap``, ``grad``, ``scan``) are skipped, their values are not known. Every failure raises
`boundjax.core.errors.BoundError` whose message names the leaf, the first offending index and the
user's source line (`first_user_frame`).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import sysconfig
import traceback
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


# Packages whose frames are not "user code" (also Python's own library, see `_is_library_file`).
LIBRARY_PACKAGES = ("boundjax", "milp", "jax", "jaxlib", "flax", "optax", "numpy")


# ----------------------------------------------------------------------------------------------
# Where: the user's source line
# ----------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
  """Directories of the `LIBRARY_PACKAGES` that are installed (found without importing them)."""
  dirs = []
  for name in LIBRARY_PACKAGES:
    try:
      spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
      spec = None
    if spec is not None and spec.submodule_search_locations:
      dirs.extend(spec.submodule_search_locations)
  return tuple(_norm(d) + os.sep for d in dirs)


@functools.lru_cache(maxsize=1)
def _stdlib_dirs() -> tuple[tuple[str, ...], tuple[str, ...]]:
  """``(stdlib directories, site-packages directories)``; the latter may lie inside the former."""
  paths = sysconfig.get_paths()
  std = {_norm(paths[k]) + os.sep for k in ("stdlib", "platstdlib") if k in paths}
  site = {_norm(paths[k]) + os.sep for k in ("purelib", "platlib") if k in paths}
  return tuple(std), tuple(site)


def _norm(path: str) -> str:
  return os.path.normcase(os.path.realpath(path))


@functools.lru_cache(maxsize=4096)
def _is_library_file(filename: str) -> bool:
  """True for files of `LIBRARY_PACKAGES`, Python's own library and frozen modules."""
  if filename.startswith("<frozen"):
    return True
  if filename.startswith("<"):          # <string>, <stdin>, notebook cells: user code
    return False
  path = _norm(filename)
  if path.startswith(_library_dirs()):
    return True
  std, site = _stdlib_dirs()
  parts = path.split(os.sep)
  in_site = path.startswith(site) or "site-packages" in parts or "dist-packages" in parts
  return path.startswith(std) and not in_site


def first_user_frame() -> str:
  """``"file.py:LINE (function)"`` of the innermost stack frame outside the library.

  The library is boundjax, jax, jaxlib, flax, optax, numpy and Python's own lib; the file is
  given by its base name. Returns ``""`` when every frame is library code.
  """
  for frame in reversed(traceback.extract_stack()):
    if not _is_library_file(frame.filename):
      return f"{os.path.basename(frame.filename)}:{frame.lineno} ({frame.name})"
  return ""


def at_user_frame() -> str:
  """`` at file.py:LINE (function)`` for an error message, or ``""`` if unknown."""
  where = first_user_frame()
  return f" at {where}" if where else ""


# ----------------------------------------------------------------------------------------------
# Checks (pure: return a description of the first problem, or None)
# ----------------------------------------------------------------------------------------------

def is_concrete_array(x: Any) -> bool:
  """True for a numpy array or scalar, or a jax.Array that is not a tracer and whose values are
  readable (not deleted, fully addressable)."""
  if isinstance(x, (np.ndarray, np.generic)):
    return True
  if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer):
    return False
  try:
    return not x.is_deleted() and x.is_fully_addressable
  except Exception:  # pylint: disable=broad-except  (exotic array types: treat as unknown)
    return False


def _first_index(mask: np.ndarray) -> tuple[int, ...]:
  idx = np.argwhere(mask)
  return tuple(int(i) for i in idx[0]) if idx.size else ()


def dtype_problem(lower_dtype: Any, upper_dtype: Any, *, strict: bool) -> str | None:
  """Why the endpoint dtypes cannot form a box: complex, bool mixed with numbers, or (if
  ``strict``) any difference ``dtype(l) != dtype(u)``."""
  lo, hi = np.dtype(lower_dtype), np.dtype(upper_dtype)
  for name, dt in (("lower", lo), ("upper", hi)):
    if jnp.issubdtype(dt, jnp.complexfloating):
      return f"{name} has complex dtype {dt} (complex numbers have no order, so no box)"
  if (lo == np.bool_) != (hi == np.bool_):
    return f"bool mixed with numbers (lower dtype {lo}, upper dtype {hi})"
  if strict and lo != hi:
    return f"lower dtype {lo} differs from upper dtype {hi}"
  return None


def value_problem(lower: Any, upper: Any, *, finite: bool = True) -> str | None:
  """Why the concrete endpoints do not form a box ``l <= u`` (host check).

  Checks, in order: equal shapes; no NaN; no ±inf (only if ``finite``); ``l <= u``.
  Endpoints with a non-numeric dtype (object placeholders, PRNG keys, float0) are not checked.
  """
  lo, hi = np.asarray(lower), np.asarray(upper)
  if lo.shape != hi.shape:
    return f"lower and upper must have equal shapes, got {lo.shape} and {hi.shape}"
  numeric = [jnp.issubdtype(a.dtype, jnp.number) or a.dtype == np.bool_ for a in (lo, hi)]
  if not all(numeric):
    return None
  for name, a in (("lower", lo), ("upper", hi)):
    if not jnp.issubdtype(a.dtype, jnp.inexact):
      continue
    bad = np.isnan(a) if not finite else ~np.isfinite(a)
    if bad.any():
      i = _first_index(bad)
      what = "NaN" if not finite else "not finite"
      return (f"{name} bound is {what} ({a[i]!r}) at index {i} "
              f"({int(bad.sum())} {'NaN' if not finite else 'non-finite'} entries)")
  bad = lo > hi
  if bad.any():
    i = _first_index(bad)
    return (f"lower > upper at index {i} (lower={lo[i]!r}, upper={hi[i]!r}; "
            f"{int(bad.sum())} entries violate lower <= upper)")
  return None


def box_problem(lower: Any, upper: Any) -> str | None:
  """Every check of a box given to a transformation: shapes, dtypes (strict), finiteness, order."""
  lo, hi = np.asarray(lower), np.asarray(upper)
  if lo.shape != hi.shape:
    return f"lower and upper must have equal shapes, got {lo.shape} and {hi.shape}"
  if lo.dtype == object or hi.dtype == object:
    return f"endpoints are not numeric arrays (lower {type(lower).__name__}, " \
           f"upper {type(upper).__name__})"
  problem = dtype_problem(jnp.result_type(lower), jnp.result_type(upper), strict=True)
  return problem or value_problem(lo, hi, finite=True)


def array_problem(x: Any) -> str | None:
  """Why a concrete non-Interval leaf cannot be bounded: NaN entries of a floating array."""
  a = np.asarray(x)
  if not jnp.issubdtype(a.dtype, jnp.inexact):
    return None
  bad = np.isnan(a)
  if bad.any():
    i = _first_index(bad)
    return f"array of shape {a.shape} has NaN at index {i} ({int(bad.sum())} NaN entries)"
  return None


# ----------------------------------------------------------------------------------------------
# Who is rebuilding a pytree: user tree operations vs. JAX's own machinery
# ----------------------------------------------------------------------------------------------

_TREE_MODULES = frozenset({"jax._src.tree_util", "jax._src.tree", "jax.tree_util", "jax.tree"})


def called_from_user_tree_op(depth: int = 1) -> bool:
  """True when the caller ``depth`` frames up was invoked by a jax tree utility (``tree_map``,
  ``tree_unflatten``, ``jax.tree.map``, ...) that user code called directly.

  False when the pytree is rebuilt by JAX's own machinery (outputs and cotangents of ``jit``,
  ``grad``, ``vmap``, ``scan``, whose C++ fast path calls unflatten with no tree-utility frame)
  or by a library (flax, optax, boundjax). Reads module names of a few frames: cheap.
  """
  f = sys._getframe(depth + 1)  # pylint: disable=protected-access
  if f.f_globals.get("__name__") not in _TREE_MODULES:
    return False
  while f is not None and f.f_globals.get("__name__") in _TREE_MODULES:
    f = f.f_back
  return f is not None and not _is_library_file(f.f_code.co_filename)
