"""The sections of ``boundjax demo``: each module's ``run()`` returns a `Section` (report + numbers).

Demo code lives here only; library modules hold none. Sections: ``data``, ``bounds``, ``crown``,
``ensembles``, ``agt``, ``barron``, ``ptr`` (core and applications) and ``ldcp``, ``idp`` (these
two use ``milp``, the layer above the applications).
"""

from __future__ import annotations

import importlib
from typing import Callable

from boundjax.demos.common import Section

SECTIONS = ("data", "bounds", "crown", "ensembles", "agt", "ldcp", "barron", "idp", "ptr")


def section(name: str) -> Callable[..., Section]:
  """The ``run`` function of the demo section ``name``."""
  if name not in SECTIONS:
    raise ValueError(f"unknown demo section {name!r}; choose from {list(SECTIONS)}")
  return importlib.import_module(f"boundjax.demos.{name}").run


__all__ = ["SECTIONS", "Section", "section"]
