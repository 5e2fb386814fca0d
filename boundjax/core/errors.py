"""Exceptions raised by boundjax."""


class UnsupportedPrimitiveError(NotImplementedError):
  """A JAX primitive has no rule in the abstract domain being used.

  The message names the primitive, the domain, and the user's source line that produced it.
  """


class BoundError(ValueError):
  """A bound computation was given inputs it cannot bound soundly (shapes, dtypes, NaN).

  Raised for invalid boxes: an `Interval` built or rebuilt with ``lower > upper``, NaN (or, at
  construction, ±inf) endpoints, complex dtype, bool mixed with numbers or unequal shapes; an
  invalid ``Interval.around`` argument; and by `boundjax.core.validation.validate_arguments` at the
  entry of ``bj.ibp``, ``bj.crown`` and ``bj.difference``. A subclass of `ValueError`, so
  ``except ValueError`` keeps working. Messages end with the user's source line
  (``at file.py:LINE (function)``).
  """


class MemoryBudgetError(MemoryError):
  """One sub-problem's bound does not fit a memory budget, even alone.

  Raised before anything is allocated or compiled, from an estimate of the bound's JAX/XLA
  buffers (`bj.crown`'s ``memory_bytes``, `boundjax verify`'s ``--memory``). ``needed`` and
  ``budget`` are in bytes and both appear in the message. A subclass of `MemoryError`, so
  ``except MemoryError`` (the verifier's fallbacks to cheaper bounds) keeps working.
  """

  def __init__(self, message: str, needed: int, budget: int):
    super().__init__(message)
    self.needed, self.budget = int(needed), int(budget)
