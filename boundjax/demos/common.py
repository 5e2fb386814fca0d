"""What a demo section returns: its report and the numbers behind it."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Section:
  """One section of ``boundjax demo``.

  Attributes:
    text: the plain-text report printed by the command.
    numbers: the measured values behind the report (JSON-serialisable scalars and lists), written
      by ``boundjax demo --json`` and checked by the tests.
  """

  text: str
  numbers: dict[str, Any]

  def __str__(self) -> str:
    return self.text
