"""The package's dependencies run one way, and no module imports itself back through others.

The folder is the layer (lowest first):

0. core: `boundjax/core/` (Interval, rounding, validation, errors, the program layer, the
   transforms), `boundjax/domains/`, and the two files beside them, `boundjax/__init__.py` (the
   public `bj.*` names) and `boundjax/nn.py` (the composites users call in their models);
1. applications: every other folder or module of `boundjax/` (data, models, training,
   executor, ensembles, hypernet, agt, privacy, ptr, barron, auditing, io, ...);
2. complete verification and MILP: `boundjax/verify/` and `milp/`;
3. the top: `boundjax/demos/` and `boundjax/cli.py`.

Every import counts, at module level or inside a function: a cycle hidden in a function is still a cycle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("boundjax", "milp")

# Folders (and the few files) of each layer but 1, which holds everything else in boundjax/.
LAYERS = {
    0: ("boundjax/core/", "boundjax/domains/", "boundjax/__init__.py", "boundjax/nn.py"),
    2: ("boundjax/verify/", "milp/"),
    3: ("boundjax/demos/", "boundjax/cli.py"),
}


def path_of(module: str) -> str:
  """``boundjax/core/interval.py`` for ``boundjax.core.interval``, ``boundjax/core/`` for a
  package (its ``__init__``), ``boundjax/__init__.py`` for the package itself."""
  path = module.replace(".", "/")
  if path == "boundjax":
    return "boundjax/__init__.py"
  return path + "/" if (ROOT / path).is_dir() else path + ".py"


def layer(module: str) -> int:
  """0 core, 1 applications, 2 verify and milp, 3 demos and the CLI: read off the folder."""
  path = path_of(module)
  for level, places in LAYERS.items():
    if any(path == p or (p.endswith("/") and path.startswith(p)) for p in places):
      return level
  return 1


def module_files() -> dict[str, Path]:
  out = {}
  for pkg in PACKAGES:
    for path in sorted((ROOT / pkg).rglob("*.py")):
      parts = list(path.relative_to(ROOT).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts = parts[:-1]
      out[".".join(parts)] = path
  return out


def imports_of(module: str, path: Path, modules: set[str]) -> set[str]:
  """Every module of ours that ``module`` imports, anywhere in its file."""
  is_pkg = path.name == "__init__.py"
  base = module.split(".") if is_pkg else module.split(".")[:-1]
  found = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        src = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
      else:
        src = node.module or ""
      names = [f"{src}.{a.name}" if f"{src}.{a.name}" in modules else src for a in node.names]
    else:
      continue
    for name in names:
      while name and name not in modules:       # `import a.b.c` of a module a.b.c, or a name in a.b
        name = name.rpartition(".")[0]
      if name and name != module:
        found.add(name)
  return found


def graph() -> dict[str, set[str]]:
  files = module_files()
  return {m: imports_of(m, p, set(files)) for m, p in files.items()}


def test_every_import_goes_down_the_layers():
  wrong = [f"{m} (layer {layer(m)}) imports {d} (layer {layer(d)})"
           for m, deps in graph().items() for d in sorted(deps) if layer(d) > layer(m)]
  assert not wrong, "\n".join(wrong)


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in g.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  sys.setrecursionlimit(10000)
  for v in g:
    if v not in index:
      visit(v)
  return out


def test_no_import_cycle():
  # A package may import its own submodules (re-exports); a submodule importing its package back
  # is a cycle like any other.
  cycles = _cycles(graph())
  assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_cycle_finder_finds_a_cycle():
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert _cycles({"a": {"b"}, "b": set()}) == []


def test_layer_assignment():
  assert layer("boundjax") == 0 and layer("boundjax.domains.linear.api") == 0
  assert layer("boundjax.core") == 0 and layer("boundjax.core.interval") == 0
  assert layer("boundjax.nn") == 0 and layer("boundjax.core.transforms") == 0
  assert layer("boundjax.agt.train") == 1 and layer("boundjax.privacy") == 1
  assert layer("boundjax.training.dpsgd") == 1 and layer("boundjax.ensembles") == 1
  assert layer("milp.idpdb") == 2 and layer("boundjax.verify.api") == 2 and layer("boundjax.verify") == 2
  assert layer("boundjax.demos.ldcp") == 3 and layer("boundjax.cli") == 3


def test_every_layer_folder_exists():
  # A folder renamed without updating LAYERS would silently drop to layer 1.
  missing = [p for places in LAYERS.values() for p in places if not (ROOT / p).exists()]
  assert not missing, missing


@pytest.mark.parametrize("entry", ["boundjax", "boundjax.agt", "boundjax.privacy",
                                   "boundjax.ensembles", "boundjax.hypernet", "boundjax.data",
                                   "boundjax.training.dpsgd", "boundjax.ptr.release",
                                   "boundjax.verify"])
def test_importing_the_library_never_loads_milp(entry):
  code = (f"import sys, importlib; importlib.import_module({entry!r}); "
          "bad = sorted(m for m in sys.modules if m == 'milp' or m.startswith('milp.')); "
          "print(bad); sys.exit(1 if bad else 0)")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}, timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]


def private_imports(source: str) -> list[str]:
  """Private names (``_x``, not dunder) taken from another module of ours: ``from boundjax.m
  import _x`` and ``alias._x`` where ``alias`` names a module imported from our packages."""
  tree = ast.parse(source)
  aliases: set[str] = set()
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
      for a in node.names:
        if a.name.startswith("_") and not a.name.startswith("__"):
          found.append(f"from {node.module} import {a.name}")
        elif (ROOT / path_of(f"{node.module}.{a.name}")).exists():
          aliases.add(a.asname or a.name)  # a module imported by name
    elif isinstance(node, ast.Import):
      for a in node.names:
        if a.name.split(".")[0] in PACKAGES and a.asname:
          aliases.add(a.asname)
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id in aliases and node.attr.startswith("_")
        and not node.attr.startswith("__")):
      found.append(f"{node.value.id}.{node.attr}")
  return found


def test_no_private_name_crosses_a_file():
  """A name a module shares is public: no module of ours reads another's ``_private`` name."""
  bad = {name: private_imports(path.read_text()) for name, path in module_files().items()}
  bad = {k: v for k, v in bad.items() if v}
  assert not bad, f"private names imported across files: {bad}"


def test_private_import_finder_finds_both_forms():
  src = ("from boundjax.core import rounding as r\nfrom boundjax.core.ir import _x\n"
         "y = r._step(1)\nz = r.gamma\n")
  assert private_imports(src) == ["from boundjax.core.ir import _x", "r._step"]
