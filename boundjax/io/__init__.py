"""Networks and properties from outside: ONNX models as JAX functions, VNNLIB properties.

    from boundjax.io import load_onnx, read_vnnlib, crown_spec, unsafe_rows_lower
    model = load_onnx("net.onnx")              # model.apply_fn(model.params, x), x: input_shape
    prop = read_vnnlib("prop.vnnlib")          # regions: input boxes with unsafe C @ y <= d
    for region in prop.regions:
      box = region.interval(model.input_shape)                  # float32, rounded outward
      for dj in region.disjuncts:
        out = bj.crown(model.apply_fn, batch_axis=None, spec=crown_spec(dj))(model.params, box)
        proved = (unsafe_rows_lower(dj, out.lower) > 0).any()  # some unsafe row fails everywhere

The applications layer: imports boundjax's core (interval, nn), never `milp`.
"""

from boundjax.io.onnx import (CONVERTERS, OnnxImportError, OnnxModel, UnsupportedOperatorError,
                              load_onnx)
from boundjax.io.vnnlib import (Disjunct, Region, VnnlibError, VnnlibProperty, crown_spec,
                                unsafe_rows_lower, outward, parse_vnnlib, read_vnnlib)

__all__ = ["load_onnx", "OnnxModel", "CONVERTERS", "OnnxImportError", "UnsupportedOperatorError",
           "read_vnnlib", "parse_vnnlib", "VnnlibProperty", "Region", "Disjunct", "VnnlibError",
           "crown_spec", "unsafe_rows_lower", "outward"]
