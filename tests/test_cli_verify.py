"""`boundjax verify`: VNN-COMP's command-line contract on a small ONNX network.

The network is built with `onnx.helper` and run by onnxruntime to check the counterexample the
command writes; the properties are chosen so the right answer is known without a verifier.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from boundjax import cli

import onnxruntime as ort  # a dev dependency (pyproject's "dev" extra), not part of boundjax


def _network(path: Path, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  w1 = rng.normal(size=(3, 8)).astype(np.float32)
  b1 = rng.normal(size=8).astype(np.float32)
  w2 = rng.normal(size=(8, 2)).astype(np.float32)
  b2 = rng.normal(size=2).astype(np.float32)
  nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
           helper.make_node("Relu", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "w2"], ["h3"]),
           helper.make_node("Add", ["h3", "b2"], ["y"])]
  inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))]
  graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], inits)
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
  onnx.save(model, path)
  return {"w1": w1, "b1": b1, "w2": w2, "b2": b2}


def _property(path: Path, condition: str) -> None:
  lines = [f"(declare-const X_{i} Real)" for i in range(3)] + \
          [f"(declare-const Y_{j} Real)" for j in range(2)]
  for i in range(3):
    lines += [f"(assert (>= X_{i} -1.0))", f"(assert (<= X_{i} 1.0))"]
  lines.append(f"(assert {condition})")
  path.write_text("\n".join(lines) + "\n")


@pytest.fixture(autouse=True)
def no_global_compile_cache(monkeypatch):
  """In-process calls of the command leave JAX's configuration alone (the persistent cache is
  checked in a subprocess, `test_batch_runs_a_csv_and_prints_a_table`)."""
  monkeypatch.setattr(cli, "compile_cache", lambda path: None)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  d = tmp_path_factory.mktemp("verify")
  _network(d / "net.onnx")
  # The outputs are bounded on the box (|y| < 1e3 for these weights), so Y_0 >= 1e6 is unreachable.
  _property(d / "unsat.vnnlib", "(>= Y_0 1000000.0)")
  # Y_0 - Y_1 <= its value at the centre is reached at the centre: sat.
  sess = ort.InferenceSession(str(d / "net.onnx"))
  y0 = sess.run(None, {"x": np.zeros((1, 3), np.float32)})[0][0]
  _property(d / "sat.vnnlib", f"(<= Y_0 {float(y0[0]) + 1e-3!r})")
  return d, sess


def test_unsat_instance_writes_unsat(files, capsys):
  d, _ = files
  assert cli.main(["verify", str(d / "net.onnx"), str(d / "unsat.vnnlib"), "--timeout", "60",
                   "--out", str(d / "unsat.txt")]) == 0
  assert (d / "unsat.txt").read_text().strip() == "unsat"
  assert capsys.readouterr().out.startswith("unsat after ")


@pytest.mark.parametrize("flag,want", [([], True), (["--no-milp"], False)])
def test_no_milp_reaches_the_verifier(files, monkeypatch, flag, want):
  """``--no-milp`` turns off the MILP fallback and refinement (``verify(milp=False)``); the
  default keeps them."""
  import boundjax.verify as bv
  from boundjax.verify.outcome import Outcome
  seen = {}

  def fake(net, prop, *, timeout, **kwargs):
    seen.update(kwargs)
    return Outcome("unsat", None, 0.1, {"nodes": 1, "phase": "bounds"})
  monkeypatch.setattr(bv, "verify_instance", fake)
  d, _ = files
  assert cli.main(["verify", str(d / "net.onnx"), str(d / "unsat.vnnlib"), "--no-compile-cache",
                   *flag]) == 0
  assert seen["milp"] is want


def test_sat_instance_writes_a_counterexample_onnxruntime_confirms(files):
  d, sess = files
  assert cli.main(["verify", str(d / "net.onnx"), str(d / "sat.vnnlib"), "--timeout", "60",
                   "--out", str(d / "sat.txt")]) == 0
  text = (d / "sat.txt").read_text()
  assert text.splitlines()[0] == "sat"
  from boundjax.verify import parse_result
  status, x, y = parse_result(text)
  assert status == "sat" and x.shape == (3,) and y.shape == (2,)
  assert np.all(x >= -1.0) and np.all(x <= 1.0)
  y_ort = sess.run(None, {"x": x.astype(np.float32)[None]})[0][0]
  np.testing.assert_allclose(y, y_ort, rtol=1e-5, atol=1e-5)
  bound = float(Path(d / "sat.vnnlib").read_text().split("(<= Y_0 ")[1].split(")")[0])
  assert y[0] <= bound


def test_batch_runs_a_csv_and_prints_a_table(files, tmp_path):
  d, _ = files
  csv_path = d / "instances.csv"
  csv_path.write_text("onnx,vnnlib\nnet.onnx,unsat.vnnlib\nnet.onnx,sat.vnnlib\n")
  proc = subprocess.run([sys.executable, "-m", "boundjax.cli", "verify", "--batch", str(csv_path),
                         "--timeout", "60", "--json", str(tmp_path / "r.json"),
                         "--compile-cache", str(tmp_path / "cache")],
                        capture_output=True, text=True, timeout=600,
                        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "1 sat, 1 unsat, 0 timeout, 0 unknown" in proc.stdout
  import json
  rows = json.loads((tmp_path / "r.json").read_text())
  assert [r["status"] for r in rows] == ["unsat", "sat"]
  assert (tmp_path / "cache").is_dir()  # the persistent compilation cache's folder


def test_missing_arguments_are_rejected():
  with pytest.raises(SystemExit, match="NET.onnx"):
    cli.main(["verify"])


def test_unreadable_files_give_a_message_not_a_traceback(files, tmp_path):
  d, _ = files
  with pytest.raises(SystemExit, match="nope.onnx"):
    cli.main(["verify", str(tmp_path / "nope.onnx"), str(d / "sat.vnnlib")])
  bad = tmp_path / "bad.vnnlib"
  bad.write_text("(declare-const X_0 Real)\n(assert (<= X_0 1.0)\n")
  with pytest.raises(SystemExit, match="boundjax verify"):
    cli.main(["verify", str(d / "net.onnx"), str(bad)])


def _sized_property(path: Path, n_in: int, n_out: int) -> None:
  lines = [f"(declare-const X_{i} Real)" for i in range(n_in)] + \
          [f"(declare-const Y_{j} Real)" for j in range(n_out)]
  for i in range(n_in):
    lines += [f"(assert (>= X_{i} -1.0))", f"(assert (<= X_{i} 1.0))"]
  lines.append(f"(assert (>= Y_{n_out - 1} 1000000.0))")
  path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("n_in, n_out, message", [
    (4, 2, r"x4\.vnnlib: 4 X variables declared, expected 3 \(paired with .*net\.onnx, whose "
           r"input has 3 entries, shape \(1, 3\), and whose output has 2\)"),
    (3, 3, r"y3\.vnnlib: 3 Y variables declared, expected 2 \(paired with .*net\.onnx")])
def test_a_property_of_another_size_names_both_files_and_counts(files, tmp_path, n_in, n_out,
                                                                message):
  """A VNNLIB file whose input or output count is not the network's failed with a raw numpy
  reshape (inputs) or matmul (outputs) error; now the reader is given the network's counts."""
  d, _ = files
  name = "x4.vnnlib" if n_in == 4 else "y3.vnnlib"
  _sized_property(tmp_path / name, n_in, n_out)
  from boundjax.io import VnnlibError
  from boundjax.verify import verify_instance
  with pytest.raises(VnnlibError, match=message):
    verify_instance(d / "net.onnx", tmp_path / name, timeout=30)
  with pytest.raises(SystemExit, match="boundjax verify: .*" + message):
    cli.main(["verify", str(d / "net.onnx"), str(tmp_path / name), "--timeout", "30"])
  # in a batch the row is reported as an error and the rows after it still get their answers
  (tmp_path / "batch.csv").write_text(
      f"onnx,vnnlib\n{d / 'net.onnx'},{tmp_path / name}\n{d / 'net.onnx'},{d / 'unsat.vnnlib'}\n")
  from boundjax.verify import run_instances
  rows = [{"onnx": str(d / "net.onnx"), "vnnlib": str(tmp_path / name)},
          {"onnx": str(d / "net.onnx"), "vnnlib": str(d / "unsat.vnnlib")}]
  results = run_instances(rows, 30, progress=False)
  assert results[0]["status"] == "error" and re.search(message, results[0]["error"])
  assert results[1]["status"] in ("sat", "unsat")
  assert cli.main(["verify", "--batch", str(tmp_path / "batch.csv"), "--timeout", "30"]) == 0


def test_complete_verify_refuses_a_property_of_another_size(files):
  """`boundjax.verify.verify` with regions or output rows of the wrong size: an OptionError
  naming both counts before any work."""
  from boundjax.core.options import OptionError
  from boundjax.io import load_onnx
  from boundjax.verify import verify
  d, _ = files
  model = load_onnx(str(d / "net.onnx"))
  box4 = (-np.ones(4), np.ones(4))
  with pytest.raises(OptionError, match=r"prop: region 0 bounds 4 inputs, the network takes 3 "
                                        r"\(input_shape \(1, 3\)\)"):
    verify(model.apply_fn, model.params, model.input_shape, [(box4, [(np.eye(2), np.zeros(2))])])
  box3 = (-np.ones(3), np.ones(3))
  with pytest.raises(OptionError, match=r"disjunct 0 of region 0 constrains 3 outputs, the "
                                        r"network gives 2"):
    verify(model.apply_fn, model.params, model.input_shape, [(box3, [(np.eye(3), np.zeros(3))])])


# ------------------------------------------------------------------------------------------------
# --memory: the verifier's memory budget
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, size", [
    ("4G", 4 << 30), ("512M", 512 << 20), ("2.5GB", int(2.5 * (1 << 30))), ("1GiB", 1 << 30),
    ("64k", 64 << 10), ("1048576", 1 << 20), (" 3 mb ", 3 << 20), ("0.5T", 1 << 39)])
def test_memory_sizes_are_parsed(text, size):
  assert cli.memory_size(text) == size


@pytest.mark.parametrize("text", ["4X", "", "G", "-1G", "0", "0.1", "1.2.3G", "4 G B", "nan",
                                  "1e9"])
def test_bad_memory_sizes_are_an_argparse_error_naming_the_value(text, capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(["verify", "net.onnx", "prop.vnnlib", f"--memory={text}"])
  assert e.value.code == 2  # argparse's usage error, before any work
  err = capsys.readouterr().err
  assert "argument --memory: invalid size" in err and repr(text) in err


def test_memory_help_says_what_it_bounds(capsys):
  with pytest.raises(SystemExit):
    cli.main(["verify", "--help"])
  out = " ".join(capsys.readouterr().out.split())
  assert "--memory SIZE" in out and "memory budget of the bound computations" in out
  assert "default 4G" in out


def test_a_budget_too_small_is_an_error_row_and_the_batch_goes_on(files, tmp_path, capsys):
  """512 bytes fit neither the dense chain nor one box's CROWN-IBP state in the engine: the
  unsat instance's row is an error naming the size it needs and the budget; the next row (sat,
  found by the attack before any bound) still gets its answer, in `run_instances` and in the
  command; a single instance exits with the message."""
  d, _ = files
  from boundjax.verify import run_instances
  rows = [{"onnx": str(d / "net.onnx"), "vnnlib": str(d / "unsat.vnnlib")},
          {"onnx": str(d / "net.onnx"), "vnnlib": str(d / "sat.vnnlib")}]
  results = run_instances(rows, 30, progress=False, memory=512)
  assert results[0]["status"] == "error", results[0]
  message = results[0]["error"]
  assert message.startswith("MemoryBudgetError: ")
  assert re.search(r"the memory budget is 512 bytes, .*a budget of at least \d+", message)
  assert results[1]["status"] == "sat"
  (tmp_path / "batch.csv").write_text("onnx,vnnlib\nnet.onnx,unsat.vnnlib\nnet.onnx,sat.vnnlib\n")
  assert cli.main(["verify", "--batch", str(tmp_path / "batch.csv"), "--root", str(d),
                   "--timeout", "30", "--memory", "512"]) == 0
  out = capsys.readouterr().out
  assert "1 sat, 0 unsat, 0 timeout, 0 unknown, 1 error" in out
  assert "unsat.vnnlib: MemoryBudgetError" in out
  with pytest.raises(SystemExit, match="boundjax verify: .*memory budget is 512 bytes"):
    cli.main(["verify", str(d / "net.onnx"), str(d / "unsat.vnnlib"), "--memory", "512"])


def _cnn_network(path: Path, seed: int = 0) -> np.ndarray:
  """Conv 3x3 (4 channels) -> ReLU -> Flatten -> dense (144 -> 10) on a (1, 1, 8, 8) input;
  returns a point of the input space."""
  rng = np.random.default_rng(seed)
  k = (rng.normal(size=(4, 1, 3, 3)) / 3).astype(np.float32)
  kb = (0.1 * rng.normal(size=4)).astype(np.float32)
  w = (rng.normal(size=(144, 10)) / 12).astype(np.float32)
  b = (0.1 * rng.normal(size=10)).astype(np.float32)
  nodes = [helper.make_node("Conv", ["x", "k", "kb"], ["c"]),
           helper.make_node("Relu", ["c"], ["r"]),
           helper.make_node("Flatten", ["r"], ["f"], axis=1),
           helper.make_node("MatMul", ["f", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
  inits = [numpy_helper.from_array(a, n) for a, n in ((k, "k"), (kb, "kb"), (w, "w"), (b, "b"))]
  graph = helper.make_graph(
      nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
  onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
  return rng.uniform(0, 1, 64)


def test_peak_memory_of_a_cnn_run_stays_under_the_budget(tmp_path):
  """`boundjax verify --memory 1G` on a small CNN (an unsat property: outputs bounded far below
  10^6), run as a grandchild so that the child's ``RUSAGE_CHILDREN`` peak is this run's alone:
  the whole process's peak resident memory (interpreter, JAX, XLA's compiler and the bound
  calls) stays under the budget."""
  x0 = _cnn_network(tmp_path / "cnn.onnx")
  lines = [f"(declare-const X_{i} Real)" for i in range(64)] + \
          [f"(declare-const Y_{j} Real)" for j in range(10)]
  for i, v in enumerate(x0):
    lines += [f"(assert (>= X_{i} {float(v) - 0.01!r}))",
              f"(assert (<= X_{i} {float(v) + 0.01!r}))"]
  lines.append("(assert (>= Y_0 1000000.0))")
  (tmp_path / "prop.vnnlib").write_text("\n".join(lines) + "\n")
  command = [sys.executable, "-m", "boundjax.cli", "verify", str(tmp_path / "cnn.onnx"),
             str(tmp_path / "prop.vnnlib"), "--timeout", "120", "--memory", "1G",
             "--no-compile-cache"]
  wrapper = ("import resource, subprocess, sys\n"
             f"proc = subprocess.run({command!r}, capture_output=True, text=True)\n"
             "sys.stderr.write(proc.stderr[-2000:])\n"
             "print(proc.returncode, proc.stdout.split()[0] if proc.stdout else '', "
             "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
  proc = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True,
                        timeout=600, cwd=Path(__file__).resolve().parents[1],
                        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  code, status, peak_kib = proc.stdout.split()[-3:]
  assert code == "0" and status == "unsat", proc.stdout + proc.stderr
  assert int(peak_kib) * 1024 < 1 << 30, f"peak RSS {int(peak_kib) / 1024:.0f} MiB"


def test_run_instances_waits_for_the_work_an_earlier_row_left_behind(monkeypatch):
  """A bound still running in a ``boundjax-worker`` thread when its instance's deadline came
  (a compilation cannot be interrupted) is waited for before the next row starts, and the
  wait is counted in no row's time (``settled``): each instance runs alone."""
  import threading
  import time as _time
  from boundjax.verify import api
  from boundjax.verify.outcome import Outcome
  seen = {}

  def fake(onnx, vnnlib, timeout, **kw):
    if str(onnx) == "first":
      threading.Thread(target=_time.sleep, args=(1.5,), name="boundjax-worker").start()
    else:
      seen["alive"] = [t for t in threading.enumerate()
                       if t.name == "boundjax-worker" and t.is_alive()]
    return Outcome("timeout", None, 0.01, {"nodes": 0, "phase": None})

  monkeypatch.setattr(api, "verify_instance", fake)
  results = api.run_instances([("first", "a"), ("second", "b")], 30, progress=False)
  assert seen["alive"] == []
  assert results[0]["settled"] < 0.5 and results[1]["settled"] >= 1.0, results
  assert results[1]["seconds"] < 1.0  # the wait is not the second row's time
  # a cap on the wait
  results = api.run_instances([("first", "a"), ("second", "b")], 30, progress=False,
                              settle_seconds=0.1)
  assert results[1]["settled"] < 1.0 and len(seen["alive"]) == 1
  api.settle(5.0)


def _printed(line: str) -> np.ndarray:
  """The numbers of a printed ``[v, v, ..., v]`` list."""
  return np.array([float(v) for v in line.split("[", 1)[1].rsplit("]", 1)[0].split(",")])


def test_sat_prints_the_counterexample_without_out(files, capsys):
  """Without ``--out`` a ``sat`` answer still shows the counterexample: its input lies in the
  box, its output is what onnxruntime computes on that input and satisfies the unsafe
  condition, and the text says it was replayed on the network."""
  d, sess = files
  assert cli.main(["verify", str(d / "net.onnx"), str(d / "sat.vnnlib"), "--timeout", "60"]) == 0
  text = capsys.readouterr().out
  assert text.startswith("sat after ") and "replayed on the network" in text, text
  x_line = next(l for l in text.splitlines() if l.strip().startswith("input x (3 values)"))
  y_line = next(l for l in text.splitlines() if l.strip().startswith("output y (2 values)"))
  x, y = _printed(x_line), _printed(y_line)
  assert x.shape == (3,) and y.shape == (2,)
  assert np.all(x >= -1.0) and np.all(x <= 1.0)
  y_ort = sess.run(None, {"x": x.astype(np.float32)[None]})[0][0]
  np.testing.assert_allclose(y, y_ort, rtol=1e-4, atol=1e-4)
  bound = float(Path(d / "sat.vnnlib").read_text().split("(<= Y_0 ")[1].split(")")[0])
  assert y[0] <= bound + 1e-5
  assert "--out" not in text  # three inputs, two outputs: every value is printed


def test_unsat_says_which_method_proved_it(files, capsys):
  d, _ = files
  assert cli.main(["verify", str(d / "net.onnx"), str(d / "unsat.vnnlib"), "--timeout", "60"]) == 0
  first = capsys.readouterr().out.splitlines()[0]
  assert re.match(r"unsat after [0-9.]+ s \(limit 60 s\): proved by ", first), first
  assert "net.onnx unsat.vnnlib" in first


def test_summary_of_a_large_counterexample_and_of_a_timeout():
  """`summary`: a counterexample of 784 inputs is shortened (the first and last values, the
  count) and points to ``--out`` or to the file given; a timeout names the nodes (singular for
  one), the best margin and the stage in words."""
  from boundjax.verify.outcome import Outcome, summary
  x = np.linspace(0.0, 1.0, 784)
  y = np.arange(10.0)
  out = Outcome("sat", (x, y), 12.34, {"nodes": 0, "phase": "attack", "stage": "attack"})
  text = summary(out, 240.0)
  lines = text.splitlines()
  assert lines[0].startswith("sat after 12.3 s (limit 240 s): counterexample found by the attack")
  assert "replayed on the network" in lines[0]
  xs = lines[1]
  shown = _printed(xs.replace(" ...,", ""))
  assert "input x (784 values)" in xs and "..." in xs and shown.size == 10, xs
  np.testing.assert_allclose(shown, np.concatenate([x[:8], x[-2:]]), rtol=1e-5)
  assert "output y (10 values): [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]" in lines[2]
  assert "--out" in lines[3]
  assert "/tmp/r.txt" in summary(out, 240.0, out_path="/tmp/r.txt")
  out = Outcome("timeout", None, 240.02, {"nodes": 1, "stage": "root", "margin": -0.0312})
  assert summary(out, 240.0) == (
      "timeout after 240.0 s (limit 240 s): 1 branch-and-bound node, best lower bound on the "
      "margin -0.0312 (stage: α-CROWN at the root of ReLU splitting)")
  out = Outcome("timeout", None, 5.0, {"nodes": 0, "stage": "crown", "margin": None})
  assert "0 branch-and-bound nodes, no certified bound" in summary(out, 5.0)
  out = Outcome("unsat", None, 3.0, {"nodes": 1234, "stage": "relu-split", "margin": 0.5})
  assert "proved by branch and bound (ReLU splitting, β-CROWN) with 1,234 nodes" in summary(out)
