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
