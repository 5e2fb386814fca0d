"""The sections of ``boundjax demo``: each module's ``run()`` returns a `Section` (report + numbers).

Demo code lives here only; library modules hold none. Sections: ``data``, ``bounds``, ``crown``,
``ensembles``, ``agt``, ``barron``, ``ptr`` (core and applications) and ``ldcp``, ``idp`` (these
two use ``milp``, the layer above the applications).

Beside its ``run`` every section module holds ``TITLE`` (the line printed before it runs),
``QUICK`` (the keyword arguments of ``boundjax demo --quick``: smaller sizes, fewer steps) and
``SECONDS`` (its wall time on a quiet 2-core CPU in both settings, printed as the expected time).
"""

from __future__ import annotations

import functools
import importlib
from typing import Callable

from boundjax.demos.common import Section

SECTIONS = ("data", "bounds", "crown", "ensembles", "agt", "ldcp", "barron", "idp", "ptr")


def _module(name: str):
  if name not in SECTIONS:
    raise ValueError(f"unknown demo section {name!r}; choose from {list(SECTIONS)}")
  return importlib.import_module(f"boundjax.demos.{name}")


def section(name: str, quick: bool = False) -> Callable[..., Section]:
  """The ``run`` function of the demo section ``name``; with ``quick``, bound to the section's
  ``QUICK`` settings (what ``boundjax demo --quick`` runs)."""
  module = _module(name)
  return functools.partial(module.run, **module.QUICK) if quick else module.run


def title(name: str) -> str:
  """What the section ``name`` shows, in a few words."""
  return _module(name).TITLE


def expected_seconds(name: str, quick: bool = False) -> float:
  """The wall seconds the section ``name`` took on a quiet 2-core CPU (its ``SECONDS``), in the
  quick or the full setting. A loaded machine takes longer: the command prints both."""
  return float(_module(name).SECONDS["quick" if quick else "full"])


__all__ = ["SECTIONS", "Section", "section", "title", "expected_seconds"]
