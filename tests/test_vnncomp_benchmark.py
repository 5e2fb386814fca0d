"""`benchmarks/vnncomp.py --isolate`: each instance in a fresh process, its row passed back; a
process that dies without a row is an ``error`` row naming its exit code (the batch goes on)."""
import os

from benchmarks import vnncomp


def _dies(row, timeout, root, queue):
  """A child that is killed before it answers (as by the kernel's OOM killer)."""
  os._exit(9)


def test_isolated_rows_come_back_and_a_dead_process_is_an_error_row(tmp_path):
  rows = []
  vnncomp.run_isolated([{"onnx": "missing.onnx", "vnnlib": "missing.vnnlib"}], 5.0, tmp_path,
                       rows.append)
  assert rows[0]["status"] == "error" and "missing.onnx" in rows[0]["error"]
  assert "outcome" not in rows[0] and rows[0]["peak_rss"] is not None
  vnncomp.run_isolated([{"onnx": "a.onnx", "vnnlib": "a.vnnlib"}], 5.0, tmp_path, rows.append,
                       target=_dies)
  assert rows[1]["status"] == "error" and "exit code 9" in rows[1]["error"]
