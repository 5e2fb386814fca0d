"""boundjax: sound bounds for neural networks as JAX function transformations.

    import boundjax as bj
    box = bj.Interval.around(x, eps, domain=(0.0, 1.0))
    out = bj.ibp(model.apply)(params, box)       # Interval over the outputs
    out = bj.crown(model.apply)(params, box)     # tighter linear (CROWN) bounds
"""

from boundjax.core.errors import BoundError, UnsupportedPrimitiveError
from boundjax.core.interval import Interval, is_interval, tree_contains

__version__ = "0.1.0"

__all__ = ["Interval", "is_interval", "tree_contains", "UnsupportedPrimitiveError", "BoundError"]

from boundjax.core.transforms import crown, difference, ibp
from boundjax.core.compile import jit
from boundjax import nn

__all__ += ["ibp", "crown", "nn", "jit"]

from boundjax.domains.difference import DiffInterval

__all__ += ["difference", "DiffInterval"]
