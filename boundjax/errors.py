"""Exceptions raised by boundjax."""


class UnsupportedPrimitiveError(NotImplementedError):
  """A JAX primitive has no rule in the abstract domain being used.

  The message names the primitive, the domain, and the user's source line that produced it.
  """


class BoundError(ValueError):
  """A bound computation was given inputs it cannot bound soundly (shapes, dtypes, NaN)."""
