"""The command line: argument handling and one fast section end to end."""

import pytest

from boundjax import cli


def test_unknown_section_is_rejected():
  with pytest.raises(SystemExit, match="unknown demo section"):
    cli.main(["demo", "--only", "nope"])


def test_data_section_runs(tmp_path, capsys):
  assert cli.main(["demo", "--only", "data", "--json", str(tmp_path / "out.json")]) == 0
  assert "breast_cancer" in capsys.readouterr().out
  assert (tmp_path / "out.json").exists()
