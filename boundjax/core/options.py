"""Checks of the options of every public entry point, in one place.

A public function of boundjax (a transformation, a trainer, a certificate, a solver front-end)
checks its numeric options and its labels here before any work starts, so that a bad value fails
at once with a message that names the option, the value and the user's own source line, instead
of producing NaN, a ``ZeroDivisionError`` deep inside, or a silently ignored keyword.

Every check raises `OptionError` (a ``ValueError``; ``TypeError`` for unknown keywords) and
returns the value converted (a Python ``float``/``int`` or a numpy array), so a caller writes
``lr = options.number("lr", lr, positive=True)``. Values held by tracers (inside ``jit``) cannot
be read and pass unchecked: the checks are for what a user passes in.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable, Mapping

import numpy as np

from boundjax.core.validation import at_user_frame, is_concrete_array


class OptionError(ValueError):
  """An option or label of a public boundjax function is out of its range (the message names
  the option, the value, what was expected and the user's line)."""


def _fail(name: str, value: Any, expected: str) -> OptionError:
  return OptionError(f"{name}={value!r}: expected {expected}{at_user_frame()}")


def number(name: str, value: Any, *, positive: bool = False, nonnegative: bool = False,
           low: float | None = None, high: float | None = None, finite: bool = True,
           allow_inf: bool = False) -> float:
  """A real scalar: finite unless ``allow_inf`` (``+inf`` allowed then, NaN never), and inside
  the given range (``low <= value <= high``; ``positive``: ``> 0``; ``nonnegative``: ``>= 0``).
  Returns it as a float."""
  if isinstance(value, bool) or not (isinstance(value, numbers.Real) or (
      isinstance(value, (np.ndarray, np.generic)) and np.ndim(value) == 0
      and np.issubdtype(np.asarray(value).dtype, np.number)) or _is_scalar_array(value)):
    raise _fail(name, value, "a real number")
  v = float(value)
  if math.isnan(v):
    raise _fail(name, value, "a number, not NaN")
  if math.isinf(v) and (finite and not (allow_inf and v > 0)):
    raise _fail(name, value, "a finite number")
  if positive and not v > 0:
    raise _fail(name, value, "a number > 0")
  if nonnegative and not v >= 0:
    raise _fail(name, value, "a number >= 0")
  if low is not None and v < low:
    raise _fail(name, value, f"a number >= {low}")
  if high is not None and v > high:
    raise _fail(name, value, f"a number <= {high}")
  return v


def _is_scalar_array(value: Any) -> bool:
  try:
    import jax  # local: a jax.Array scalar
  except ImportError:  # pragma: no cover
    return False
  return (isinstance(value, jax.Array) and is_concrete_array(value) and value.ndim == 0
          and np.issubdtype(value.dtype, np.number))


def integer(name: str, value: Any, *, minimum: int | None = None,
            maximum: int | None = None) -> int:
  """An integer count or index (a float such as ``2.5`` or a bool is refused; ``2.0`` is not an
  integer either), with ``minimum <= value <= maximum`` where given."""
  if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
    raise _fail(name, value, "an integer" + _range_text(minimum, maximum))
  v = int(value)
  if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
    raise _fail(name, value, "an integer" + _range_text(minimum, maximum))
  return v


def _range_text(minimum: int | None, maximum: int | None) -> str:
  if minimum is not None and maximum is not None:
    return f" in [{minimum}, {maximum}]"
  if minimum is not None:
    return f" >= {minimum}"
  if maximum is not None:
    return f" <= {maximum}"
  return ""


def finite_array(name: str, x: Any) -> Any:
  """An array with no NaN and no ±inf (concrete values only; a tracer passes). Returns ``x``."""
  if not is_concrete_array(x) and not isinstance(x, (list, tuple)):
    return x
  a = np.asarray(x)
  if a.dtype == object or not np.issubdtype(a.dtype, np.number):
    if a.dtype == np.bool_:
      return x
    raise OptionError(f"{name}: expected a numeric array, got dtype {a.dtype}{at_user_frame()}")
  if np.issubdtype(a.dtype, np.inexact):
    bad = ~np.isfinite(a)
    if bad.any():
      i = tuple(int(k) for k in np.argwhere(bad)[0])
      kind = "NaN" if np.isnan(a[i]) else repr(a[i].item())
      raise OptionError(f"{name}: {int(bad.sum())} entries are NaN or infinite (first: {kind} "
                        f"at index {i}); bounds need finite numbers{at_user_frame()}")
  return x


def class_labels(name: str, y: Any, n_classes: int) -> Any:
  """Integer class labels in ``0 .. n_classes - 1`` (integral floats such as ``1.0`` are
  accepted; ``1.5``, ``-1`` or ``n_classes`` are not). Concrete values only. Returns ``y``."""
  if not is_concrete_array(y) and not isinstance(y, (list, tuple, numbers.Number)):
    return y
  a = np.asarray(y)
  if not np.issubdtype(a.dtype, np.number) or np.issubdtype(a.dtype, np.complexfloating):
    raise OptionError(f"{name}: class labels must be integers, got dtype {a.dtype}"
                      f"{at_user_frame()}")
  bad = ~np.isfinite(a) | (a != np.round(a)) | (a < 0) | (a >= n_classes) \
      if np.issubdtype(a.dtype, np.inexact) else (a < 0) | (a >= n_classes)
  if np.any(bad):
    i = tuple(int(k) for k in np.argwhere(np.atleast_1d(bad))[0])
    v = np.atleast_1d(a)[i].item()
    raise OptionError(f"{name}: label {v!r} at index {i} is not a class of a network with "
                      f"{n_classes} outputs (expected an integer in 0 .. {n_classes - 1}; "
                      f"{int(np.sum(bad))} such labels){at_user_frame()}")
  return y


def binary_labels(name: str, y: Any) -> Any:
  """Labels of a single-logit (binary cross-entropy) model: each 0 or 1."""
  if not is_concrete_array(y) and not isinstance(y, (list, tuple)):
    return y
  a = np.asarray(y)
  bad = ~np.isin(a, (0, 1))
  if np.any(bad):
    i = tuple(int(k) for k in np.argwhere(np.atleast_1d(bad))[0])
    raise OptionError(f"{name}: binary cross-entropy labels must be 0 or 1, got "
                      f"{np.atleast_1d(a)[i].item()!r} at index {i} ({int(np.sum(bad))} such labels)"
                      f"{at_user_frame()}")
  return y



def labels_in(name: str, y: Any, allowed: Iterable[float], loss: str) -> Any:
  """Labels of a loss that takes a fixed set of values (e.g. ``{-1, 0, 1}`` for a logistic
  loss whose sign decides the class): each label is one of ``allowed``. Returns ``y``."""
  if not is_concrete_array(y) and not isinstance(y, (list, tuple)):
    return y
  allowed = tuple(allowed)
  a = np.asarray(y)
  bad = ~np.isin(a, allowed)
  if np.any(bad):
    i = tuple(int(k) for k in np.argwhere(np.atleast_1d(bad))[0])
    raise OptionError(f"{name}: {loss} labels must be one of "
                      f"{', '.join(repr(v) for v in allowed)}, got "
                      f"{np.atleast_1d(a)[i].item()!r} at index {i} ({int(np.sum(bad))} such "
                      f"labels){at_user_frame()}")
  return y


def index_array(name: str, value: Any, *, minimum: int | None = None,
                maximum: int | None = None) -> np.ndarray:
  """An array of integer indices (row numbers), each with ``minimum <= i <= maximum`` where
  given. As with `integer`, a float such as ``1.7`` (or ``1.0``) is refused rather than
  truncated to another row. An empty list passes. Returns it as a numpy ``int64`` array."""
  a = np.asarray(value)
  if a.size == 0:
    return a.astype(np.int64)
  if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer):
    flat = a.reshape(-1)
    i = 0
    if np.issubdtype(a.dtype, np.number) and a.dtype != np.bool_:
      i = int(np.argmax(~np.isfinite(flat) | (flat != np.round(flat))))
    v = flat[i].item() if isinstance(flat[i], np.generic) else flat[i]
    raise OptionError(f"{name}: expected integer indices{_range_text(minimum, maximum)}, got "
                      f"{v!r} at position {tuple(int(k) for k in np.unravel_index(i, a.shape))} "
                      f"(dtype {a.dtype})"
                      f"{at_user_frame()}")
  bad = np.zeros(a.shape, bool)
  if minimum is not None:
    bad |= a < minimum
  if maximum is not None:
    bad |= a > maximum
  if bad.any():
    i = tuple(int(k) for k in np.argwhere(bad)[0])
    raise OptionError(f"{name}: index {a[i].item()!r} at position {i} is out of range "
                      f"(expected an integer{_range_text(minimum, maximum)}; {int(bad.sum())} "
                      f"such indices){at_user_frame()}")
  return a.astype(np.int64)

def one_of(name: str, value: Any, choices: Iterable[Any]) -> Any:
  """``value`` is one of ``choices``."""
  choices = tuple(choices)
  if value not in choices:
    raise _fail(name, value, "one of " + ", ".join(repr(c) for c in choices))
  return value


def no_unknown_keywords(function: str, given: Mapping[str, Any], known: Iterable[str], *,
                        case: str = "") -> None:
  """Raises ``TypeError`` naming the first keyword of ``given`` that ``function`` does not take
  (instead of ignoring it silently), with the keywords it does take. ``case`` names the mode
  whose keywords ``known`` are, when they depend on one (e.g. ``"kind='tanh'"``)."""
  known = tuple(known)
  unknown = [k for k in given if k not in known]
  if unknown:
    raise TypeError(f"{function}() got unexpected keyword argument(s) "
                    f"{', '.join(repr(k) for k in unknown)}"
                    f"{' with ' + case if case else ''}; it takes "
                    f"{', '.join(known) if known else 'none'}{at_user_frame()}")
