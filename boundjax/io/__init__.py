"""Networks and properties from outside: ONNX models as JAX functions, VNNLIB properties.

    from boundjax.io import load_onnx, read_vnnlib
    model = load_onnx("net.onnx")                  # model.apply_fn(model.params, x)
    prop = read_vnnlib("prop.vnnlib")              # input boxes and unsafe output conditions
"""

from boundjax.io.onnx import (CONVERTERS, OnnxImportError, OnnxModel, UnsupportedOperatorError,
                              load_onnx)

__all__ = ["load_onnx", "OnnxModel", "CONVERTERS", "OnnxImportError", "UnsupportedOperatorError"]
from boundjax.io.vnnlib import (Disjunct, Region, VnnlibError, VnnlibProperty, crown_spec,
                                margins_lower, parse_vnnlib, read_vnnlib)

__all__ += ["read_vnnlib", "parse_vnnlib", "VnnlibProperty", "Region", "Disjunct", "VnnlibError",
            "crown_spec", "margins_lower"]
