"""The complete verifier's first bound, and its memory estimate of the dense path.

**Engine bounds** (`prove_with_engine`): every region's box is bounded by the engine
(`boundjax.crown`, the one bound engine of the program layer) on the composed function

    g(x) = C' flatten(apply_fn(params, x)) - d'

where ``C'`` stacks the rows of all of the region's disjuncts (one backward pass bounds them
all) and ``d'`` is ``d`` rounded up to float32, so ``C y - d >= C' y - d'`` (CROWN, Zhang et al.
2018, §3.3: bounding the specification's linear function of the outputs, not each output). This
is how a specification enters the engine in sound mode: ``bj.crown(spec=...)`` refuses
``sound=True``, whereas a composed matrix product is one more affine equation that sound mode
rounds outward like any other. When ``C`` is not exact in float32 the outputs are bounded
instead and combined with ``C, d`` by outward-rounded interval arithmetic
(`rows_lower`). The box is the float64 region rounded outward to
float32; with ``sound=True`` the bound runs in float64 instead (the region, ``C``, ``d`` and
the weights as they are: float32 weights are exact in float64), where sound mode's a-priori
rounding slack is negligible, and every bound holds in exact arithmetic for the network's
weights. A disjunct is proven when one of its rows has a certified lower bound ``> 0``.

Modes run in turn, only on regions left open: CROWN (``intermediate="crown"``); CROWN-IBP
(``"ibp"``) only if CROWN's backward state of one box exceeds ``memory_bytes`` (the engine
raises ``MemoryError`` while tracing, before allocating or compiling; CROWN-IBP is exact for
one ReLU layer behind an affine map of the box, e.g. VeriVital's Convnet_avgpool, whose CROWN
state would be 12 GB); then α-CROWN (Xu et al., ICLR 2021, ``alpha=True``) on the tightest
intermediate mode that fitted. Each compilation costs tens of seconds on a loaded CPU, hence
no CROWN-IBP pass before CROWN.

**Deadline.** XLA compilation of a sound bound can take minutes on a loaded CPU (ACAS Xu's
6×50 network: 90 s for CROWN, measured with a load of 8 on 2 cores), and it cannot be
interrupted. Each bound runs in a worker thread joined for at most its time budget; when the
budget runs out the verifier goes on without it (the thread finishes in the background and its
compiled program stays cached for the next instance of the same architecture, see
`bound_function`).

**Dense-path memory** (`dense_plan`): the extraction to an affine/ReLU chain densified in
float64 (`boundjax.verify.chain`) costs about ``8 (2 Σ n_k n_{k-1} + B · 2 max_k n_k n_{k-1}
+ F Σ_k n_k)`` bytes: the weights and their absolute values, one batch of ``B`` sub-problems'
backward states (intermediate CROWN bounds of layer ``k`` from layer ``k-1``), and a frontier
of ``F`` ReLU-split domains (α, β, coefficients and splits per neuron). Widths ``n_k`` are read
from the traced program (the box-dependent max/min/clamp/pooling equations) before anything is
built; a CIFAR CNN (VeriVital Convnet_avgpool: 784 → 23,328 → 10) needs ~37 GB at ``B = 256``
and goes to the generic path instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import threading
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.core.transforms import affine_image
from boundjax.verify.outcome import Deadline
from boundjax.verify.spec import Region

MODES = ("crown", "ibp", "alpha")

# primitives that become layers of the dense chain (`milp.network.from_function`)
_LAYER_PRIMITIVES = frozenset({"max", "min", "clamp", "reduce_window_max", "reduce_window_min",
                               "reduce_max", "reduce_min", "argmax", "argmin"})


# ------------------------------------------------------------------------------------------------
# float32 rounding of the box and of the specification
# ------------------------------------------------------------------------------------------------

def box_f32(lower: np.ndarray, upper: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """A float32 box ``[l, u] ⊇ [lower, upper]`` (each end rounded outward by one ulp at most)."""
  lower, upper = np.asarray(lower, np.float64), np.asarray(upper, np.float64)
  lo = lower.astype(np.float32)
  hi = upper.astype(np.float32)
  lo = np.where(lo.astype(np.float64) > lower, np.nextafter(lo, np.float32(-np.inf)), lo)
  hi = np.where(hi.astype(np.float64) < upper, np.nextafter(hi, np.float32(np.inf)), hi)
  return lo.astype(np.float32), hi.astype(np.float32)


def spec_f32(C: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
  """``(C32, d32)`` with ``C32 == C`` exactly and ``d32 >= d`` (rounded up), so that
  ``C32 y - d32 <= C y - d`` for every real ``y``; None when ``C`` is not exact in float32."""
  C, d = np.asarray(C, np.float64), np.asarray(d, np.float64)
  C32 = C.astype(np.float32)
  if not np.array_equal(C32.astype(np.float64), C):
    return None
  d32 = d.astype(np.float32)
  d32 = np.where(d32.astype(np.float64) < d, np.nextafter(d32, np.float32(np.inf)), d32)
  if not (np.all(np.isfinite(C32)) and np.all(np.isfinite(d32))):
    return None
  return C32, d32.astype(np.float32)


# ------------------------------------------------------------------------------------------------
# the engine's bound of one region, with compiled programs shared by equal architectures
# ------------------------------------------------------------------------------------------------

def fingerprint(apply_fn: Callable, params: Any, input_shape: Sequence[int]) -> str:
  """A digest of the traced computation ``(params, x) -> apply_fn(params, x)``: the jaxpr's text
  (primitives, their parameters, shapes, literals) and the values of its closed-over constants.
  Equal digests mean the same function of ``(params, x)``, so a bound compiled for one network
  serves another with the same architecture and other weights (ACAS Xu's 45 networks)."""
  x = jax.ShapeDtypeStruct(tuple(input_shape), jnp.float32)
  closed = jax.make_jaxpr(apply_fn)(params, x)
  h = hashlib.sha256(str(closed.jaxpr).encode())
  for c in closed.consts:
    a = np.asarray(c)
    h.update(f"{a.shape}{a.dtype}".encode())
    h.update(a.tobytes())
  h.update(str(jax.tree_util.tree_structure(params)).encode())
  return h.hexdigest()


@dataclasses.dataclass
class _Entry:
  fn: Callable
  lock: threading.Lock


_CACHE: dict[tuple, _Entry] = {}
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 8


S_SHAPED_PRIMITIVES = ("logistic", "tanh")

S_SHAPED_ALPHA_STEPS = 100
"""α-CROWN's steps on a logistic/tanh network (tangent points of every layer optimised). Its
loop is not unrolled, so steps cost little beside the compilation: on VNN-COMP 2021's ERAN 6×200
sigmoid network (idx 4214, sound float64, one box, 2 cores, learning rate 0.2) 20 steps take 53 s
with compilation and prove all nine rows (smallest margin 0.68), 50 steps 57 s (1.63). Before the
intermediate slopes got their own bounds' gradient (`domains.linear.backward`,
``_straight_through``) the optimisation stalled: 150 steps proved eight rows (the ninth -2.11),
500 steps the same eight (-2.08). The extra steps are kept for harder properties."""


def has_primitive(apply_fn: Callable, params: Any, input_shape: Sequence[int],
                  names: Sequence[str]) -> bool:
  """Whether the network applies one of the primitives ``names`` (nested calls included). The
  input is traced in the parameters' floating type (float64 parameters, e.g. in sound mode,
  would not mix with a float32 input in a convolution)."""
  floats = [a.dtype for a in jax.tree_util.tree_leaves(params)
            if hasattr(a, "dtype") and jnp.issubdtype(a.dtype, jnp.floating)]
  dtype = jax.dtypes.canonicalize_dtype(np.result_type(*floats) if floats else np.float32)
  jaxpr = jax.make_jaxpr(lambda x: apply_fn(params, x))(
      jax.ShapeDtypeStruct(tuple(input_shape), dtype))

  def walk(jp) -> bool:
    for e in jp.eqns:
      if e.primitive.name in names:
        return True
      for v in e.params.values():
        inner = getattr(v, "jaxpr", v)
        if hasattr(inner, "eqns") and walk(inner):
          return True
    return False
  return walk(jaxpr.jaxpr)


def has_s_shaped(apply_fn: Callable, params: Any, input_shape: Sequence[int]) -> bool:
  """Whether the network applies logistic or tanh (nested calls included)."""
  return has_primitive(apply_fn, params, input_shape, S_SHAPED_PRIMITIVES)


def bound_function(apply_fn: Callable, key: str, input_shape: tuple[int, ...], sound: bool,
                    mode: str, memory_bytes: int, *, lower_only: bool = False,
                    s_shaped: bool = False) -> _Entry:
  """``bound(params, C, d, box) -> Interval`` of ``C flatten(apply_fn(params, x)) - d`` for a
  batch of boxes (``mode``: ``"ibp"``, ``"crown"``, ``"alpha"`` or ``"alpha-ibp"``, α-CROWN on
  CROWN-IBP's intermediate bounds; ``bj.crown`` with ``batch_axis=0``, whose memory check
  guards the backward state), cached per architecture ``key`` and mode. α-CROWN optimises the
  lower bounds alone with ``lower_only`` (the verifier's rows ``C y - d``), and with
  ``s_shaped`` (a logistic/tanh network) also the intermediate layers' tangent points: there
  the gains compound through the layers (on VNN-COMP 2021's ERAN 6×200 sigmoid network CROWN
  proves none of the ten shared properties, α-CROWN with intermediate layers eight), while a
  ReLU network's intermediate α is ReLU splitting's root (`relu_bab`)."""
  import boundjax as bj
  ck = (key, input_shape, sound, mode, memory_bytes, lower_only, s_shaped)
  with _CACHE_LOCK:
    entry = _CACHE.get(ck)
    if entry is None:

      def g(params, C, d, xb):
        one = lambda x: C @ jnp.reshape(apply_fn(params, jnp.reshape(x, input_shape)), (-1,)) - d
        return jax.vmap(one)(xb)

      alpha = {}
      if mode.startswith("alpha"):
        alpha = dict(alpha=True, alpha_objective="lower_only" if lower_only else "both")
        if s_shaped and mode == "alpha":
          alpha.update(alpha_intermediate=True, alpha_lr=0.2, alpha_steps=S_SHAPED_ALPHA_STEPS)
      fn = bj.crown(g, batch_axis=0, sound=sound, memory_bytes=memory_bytes,
                    intermediate="crown" if mode in ("crown", "alpha") else "ibp", **alpha)
      if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
      entry = _CACHE[ck] = _Entry(fn, threading.Lock())
  return entry


def region_rows(region: Region) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
  """The region's disjuncts stacked: ``C (R, m)``, ``d (R,)`` and each disjunct's row range."""
  Cs = [dj.C for dj in region.disjuncts]
  ds = [dj.d for dj in region.disjuncts]
  ends = np.cumsum([len(d) for d in ds])
  ranges = [(int(e - len(d)), int(e)) for e, d in zip(ends, ds)]
  return np.concatenate(Cs), np.concatenate(ds), ranges


def rows_lower(y_lo: np.ndarray, y_hi: np.ndarray, C: np.ndarray, d: np.ndarray, sound: bool):
  """Lower bounds of ``C y - d`` for ``y`` in ``[y_lo, y_hi]`` (B, m): (B, k), outward."""
  if sound:
    return affine_image(C, -np.asarray(d, np.float64), y_lo, y_hi)[0]
  Cp, Cn = np.maximum(C, 0.0), np.minimum(C, 0.0)
  return y_lo @ Cp.T + y_hi @ Cn.T - d


_S_SHAPED: dict[tuple, bool] = {}


def _s_shaped_cached(apply_fn: Callable, params: Any, key: str, shape: tuple) -> bool:
  if (key, shape) not in _S_SHAPED:
    _S_SHAPED[(key, shape)] = has_s_shaped(apply_fn, params, shape)
  return _S_SHAPED[(key, shape)]


PAD_TO_OUTPUTS = 64
"""`padded_rows` pads to a multiple of the output count up to this many outputs, beyond it to a
power of two (1 open row of a 1000-class network stays 1 row, not 1000)."""


def padded_rows(C: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """``(C, d)`` with zero rows appended: up to the next multiple of the output count ``m`` (at
  least ``m``) when ``m <= PAD_TO_OUTPUTS``, else up to the next power of two. The verifier
  bounds the disjuncts still open, whose number varies from one instance to the next; a
  compiled bound is specific to its number of rows, so without padding each count costs its
  own compilation, in the process and in the persistent cache (VNN-COMP 2021's ERAN 6×200
  sigmoid network: α-CROWN compiles in about 55 s and runs in 8 s, and CROWN leaves 6 to 9 of
  its 9 rows open). A zero row's bound is ``0 ≥ 0`` whatever the slopes: it adds nothing to
  α-CROWN's objective or gradient, and its bound is dropped."""
  k, m = C.shape
  if m <= PAD_TO_OUTPUTS:
    target = max(m, -(-k // m) * m)
  else:
    target = 1 << max(k - 1, 0).bit_length()
  if target == k:
    return C, d
  return (np.concatenate([C, np.zeros((target - k, m), C.dtype)]),
          np.concatenate([d, np.zeros(target - k, d.dtype)]))


def region_lower(apply_fn: Callable, params: Any, input_shape: Sequence[int], key: str,
                 region: Region, *, sound: bool, mode: str,
                 memory_bytes: int) -> np.ndarray:
  """Certified lower bounds (float64, NaN replaced by -inf) of every row ``C_i y - d_i`` of
  the region's stacked disjuncts over its box, from the engine in ``mode``, in the precision
  of `bound_precision`. The rows are padded (`padded_rows`), so one compiled bound serves any
  number of open rows up to the output count."""
  shape = tuple(int(s) for s in input_shape)
  C, d, _ = region_rows(region)
  n_rows = C.shape[0]
  with bound_precision(sound):
    exact = engine_spec(C, d, sound)
    entry = bound_function(apply_fn, key, shape, sound, mode, memory_bytes,
                           lower_only=exact is not None,
                           s_shaped=mode == "alpha" and _s_shaped_cached(apply_fn, params, key,
                                                                           shape))
    p = engine_params(params, sound)
    box = engine_box(region.lower[None], region.upper[None], sound)
    dt = box.lower.dtype
    with entry.lock:
      if exact is not None:
        Cp, dp = padded_rows(*exact)
        out = entry.fn(p, jnp.asarray(Cp, dt), jnp.asarray(dp, dt), box)
        low = np.asarray(out.lower, np.float64)[0, :n_rows]
      else:  # bound the outputs themselves, then C, d by outward interval arithmetic
        m = C.shape[1]
        out = entry.fn(p, jnp.eye(m, dtype=dt), jnp.zeros(m, dt), box)
        low = rows_lower(np.asarray(out.lower, np.float64), np.asarray(out.upper, np.float64),
                          C, d, sound)[0]
  return np.where(np.isnan(low), -np.inf, low)


# ------------------------------------------------------------------------------------------------
# the precision of the engine's bounds: float64 in sound mode, float32 otherwise
# ------------------------------------------------------------------------------------------------

def bound_precision(sound: bool):
  """The context every engine bound of the verifier runs in: float64 enabled in sound mode
  (``jax.enable_x64`` is thread-local: this worker's calls only), nothing otherwise.

  Sound mode bounds in float64, with the region, ``C``, ``d`` and the parameters as they are
  (float32 weights are exact in float64), so the a-priori rounding slack of sound mode (γ_n,
  see `boundjax.domains.linear`) is about 10^-16 of the magnitudes instead of 10^-7; on a deep
  network the float32 slack widens every layer's bounds and compounds (CIFAR10-ResNet 4b,
  VNN-COMP 2021 prop 12: CROWN's smallest margin 0.62 in float64, -1.51 in float32). Float
  mode bounds in float32, on a box rounded outward (`box_f32`), ``C`` exact and ``d`` rounded
  up (`spec_f32`), and parameters that must equal their float32 rounding
  (`params_exact_f32`)."""
  return jax.enable_x64(True) if sound else contextlib.nullcontext()


def engine_params(params: Any, sound: bool) -> Any:
  """``params`` in the bound's precision (call within `bound_precision`)."""
  return jax.tree_util.tree_map(to_f64 if sound else to_f32, params)


def engine_box(lower: np.ndarray, upper: np.ndarray, sound: bool):
  """The `Interval` the engine bounds for the float64 box ``[lower, upper]``: the box itself
  in float64 (sound), else the float32 box containing it (call within `bound_precision`)."""
  import boundjax as bj
  if sound:
    return bj.Interval(jnp.asarray(lower, jnp.float64), jnp.asarray(upper, jnp.float64))
  lo, hi = box_f32(lower, upper)
  return bj.Interval(jnp.asarray(lo), jnp.asarray(hi))


def engine_spec(C: np.ndarray, d: np.ndarray, sound: bool):
  """``(C, d)`` in the bound's precision, with ``C' y - d' <= C y - d`` for every real ``y``:
  as they are in float64 (sound), else `spec_f32` (None when ``C`` is not exact in float32)."""
  if sound:
    return np.asarray(C, np.float64), np.asarray(d, np.float64)
  return spec_f32(C, d)


def params_exact_f32(params: Any) -> bool:
  """True iff every floating parameter equals its float32 rounding (ONNX weights do): the
  engine then bounds the very network the float64 replay evaluates. Otherwise casting would
  bound another network, and no engine bound is used."""
  for a in jax.tree_util.tree_leaves(params):
    arr = np.asarray(a)
    if np.issubdtype(arr.dtype, np.floating) and arr.dtype.itemsize > 4:
      with np.errstate(over="ignore"):
        if not np.array_equal(arr.astype(np.float32).astype(arr.dtype), arr, equal_nan=True):
          return False
  return True


def to_f32(a: Any) -> Any:
  if isinstance(a, (np.ndarray, jax.Array)) and jnp.issubdtype(a.dtype, jnp.floating):
    return jnp.asarray(a, jnp.float32)
  return a


def to_f64(a: Any) -> Any:
  """A floating array as float64 (exact for float32 and lower); anything else as it is."""
  if isinstance(a, (np.ndarray, jax.Array)) and jnp.issubdtype(a.dtype, jnp.floating):
    return jnp.asarray(a, jnp.float64)
  return a


class Job:
  """``fn()`` running in a worker thread (`start`); `wait` joins it for a time budget."""

  def __init__(self, fn: Callable[[], Any]):
    self._result: dict[str, Any] = {}

    def work():
      try:
        self._result["value"] = fn()
      except BaseException as e:  # noqa: BLE001  (re-raised in the caller's thread)
        self._result["error"] = e

    # not a daemon: the interpreter's shutdown waits for it (a daemon thread stopped inside
    # XLA's compiler aborts the process: "terminate called ... FATAL: exception not rethrown")
    self._thread = threading.Thread(target=work, daemon=False, name="boundjax-worker")
    self._thread.start()

  def done(self) -> bool:
    """True once ``fn`` has returned or raised."""
    return not self._thread.is_alive()

  def wait(self, seconds: float) -> tuple[bool, Any]:
    """Joins the worker for at most ``seconds``: ``(True, value)``, or ``(False, None)`` when
    it is still running (it is left to finish on its own). An exception of ``fn`` is raised
    here."""
    self._thread.join(max(float(seconds), 0.0))
    if self._thread.is_alive():
      return False, None
    if "error" in self._result:
      raise self._result["error"]
    return True, self._result["value"]


def start(fn: Callable[[], Any]) -> Job:
  """Starts ``fn()`` in a worker thread named ``boundjax-worker`` and returns its `Job`."""
  return Job(fn)


def call_with_budget(fn: Callable[[], Any], seconds: float) -> tuple[bool, Any]:
  """Runs ``fn()`` in a worker thread and waits at most ``seconds``: ``(True, value)``, or
  ``(False, None)`` when the budget ran out (the thread is left to finish on its own; the
  interpreter waits for it at exit, which `boundjax verify` skips, see
  `boundjax.cli._leave_if_compiling`). An exception of ``fn`` is raised here."""
  return start(fn).wait(seconds)


@dataclasses.dataclass
class EngineResult:
  """Per region, which disjuncts are proven (``proven[r][j]``), the best certified lower bound
  of each disjunct's margin (``lower[r][j]``: the largest row lower bound of ``C y - d`` over
  the modes that ran, ``-inf`` when none finished), and per mode what happened (``"proved"``,
  ``"open"``, ``"memory"``, ``"budget"``, ``"skipped"``)."""

  proven: list[np.ndarray]
  modes: dict[str, str]
  lower: list[np.ndarray] = dataclasses.field(default_factory=list)
  pending: Job | None = None
  """A bound still running when its budget ran out (left behind: a compilation or a jitted
  α-CROWN loop cannot be interrupted), whose buffers are still live; None when none is."""
  pending_region: Region | None = None
  """The region ``pending`` bounds (its value: `region_lower`'s rows of that region), so that a
  bound finishing late can still prove its disjuncts (`late_proofs`)."""

  @property
  def all_proven(self) -> bool:
    return all(bool(np.all(p)) for p in self.proven)

  @property
  def decided_by(self) -> str | None:
    """The mode that proved the last open disjunct (``"crown"``, ``"ibp"`` or ``"alpha"``),
    None when some disjunct is still open."""
    if not self.all_proven:
      return None
    return next((m for m, s in self.modes.items() if s == "proved"), None)

  @property
  def margin(self) -> float:
    """The property's certified margin: the smallest disjunct's best lower bound (``> 0``
    iff every disjunct is proven; ``-inf`` when a disjunct has no bound)."""
    lows = [float(x) for low in self.lower for x in low]
    return min(lows) if lows else -np.inf


def prove_with_engine(apply_fn: Callable, params: Any, input_shape: Sequence[int],
                      regions: Sequence[Region], deadline: Deadline, budget: float, *,
                      sound: bool = True, memory_bytes: int = 1 << 30,
                      modes: Sequence[str] = MODES, fitted: Sequence[str] = ()
                      ) -> EngineResult:
  """Bounds every region with the engine (see the module docstring) within ``budget`` seconds
  (and ``deadline``); a mode runs only on regions with an open disjunct. ``fitted``: modes an
  earlier call ran within the memory budget (α-CROWN runs on their intermediate bounds when
  ``modes`` holds ``"alpha"`` alone). Returns the `EngineResult`."""
  phase = Deadline(min(budget, deadline.remaining()))
  proven = [np.zeros(len(r.disjuncts), bool) for r in regions]
  lower = [np.full(len(r.disjuncts), -np.inf) for r in regions]
  pending, pending_region = None, None
  status: dict[str, str] = {}
  if not sound and not params_exact_f32(params):  # float32 would bound another network
    return EngineResult(proven, {m: "params not float32" for m in modes}, lower)
  key = fingerprint(apply_fn, params, input_shape)
  fits: set[str] = set(fitted)
  for mode in modes:
    open_regions = [i for i, p in enumerate(proven) if not np.all(p)]
    if not open_regions:
      break
    if phase.expired():
      status[mode] = "budget"
      continue
    if (mode == "alpha" and not fits) or (mode == "ibp" and status.get("crown") != "memory"
                                          and "crown" in modes):
      status[mode] = "skipped"  # CROWN-IBP only where CROWN does not fit the memory budget
      continue
    # α-CROWN on the tightest intermediate bounds that fit the memory budget
    run_mode = ("alpha" if "crown" in fits else "alpha-ibp") if mode == "alpha" else mode
    try:
      for i in open_regions:
        r = regions[i]
        if any(dj.C.shape[0] == 0 for dj in r.disjuncts):
          continue  # an empty conjunction holds everywhere: never proven by a bound
        job = start(lambda r=r: region_lower(apply_fn, params, input_shape, key, r,
                                             sound=sound, mode=run_mode,
                                             memory_bytes=memory_bytes))
        finished, low = job.wait(phase.remaining())
        if not finished:
          status[mode] = "budget"
          pending, pending_region = job, r
          break
        _, _, ranges = region_rows(r)
        best = np.array([float(np.max(low[a:b])) for a, b in ranges])
        lower[i] = np.maximum(lower[i], best)
        proven[i] |= best > 0
      else:
        status[mode] = "proved" if all(np.all(p) for p in proven) else "open"
        fits.add(mode)
    except MemoryError:
      status[mode] = "memory"
    if pending is not None:  # a bound left behind: no other mode beside its buffers
      break
  return EngineResult(proven, status, lower, pending, pending_region)


def late_proofs(value: Any, where: Region | Sequence[Region]) -> dict[int, float]:
  """The certified lower bound of each disjunct's margin, keyed by the disjunct's ``id``, that a
  bound left behind at its budget delivered after all: ``value`` is the finished job's value,
  `region_lower`'s rows of the region ``where``, or a whole stage's `EngineResult` of the
  regions ``where`` (`prove_with_engine`)."""
  if value is None or where is None:
    return {}
  if isinstance(value, EngineResult):
    return {id(dj): float(v) for r, low in zip(where, value.lower)
            for dj, v in zip(r.disjuncts, low)}
  _, _, ranges = region_rows(where)
  low = np.asarray(value, np.float64)
  return {id(dj): float(np.max(low[a:b])) for dj, (a, b) in zip(where.disjuncts, ranges)
          if b > a}


# ------------------------------------------------------------------------------------------------
# memory of the dense path, estimated before building it
# ------------------------------------------------------------------------------------------------

def layer_widths(apply_fn: Callable, params: Any, input_shape: Sequence[int]) -> tuple[int, ...]:
  """``(n_0, n_1, ..., n_L)``: input size, the size of every box-dependent max/min/clamp/pooling
  equation of the traced program (the larger of its operand and result), and the output size.
  An estimate of the dense chain's widths (`milp.network.from_function` may add carried values
  for skip connections), read without building anything."""
  from boundjax.core.program import flatten, mark_dependence
  x = jax.ShapeDtypeStruct(tuple(input_shape), jnp.float32)
  closed = jax.make_jaxpr(lambda v: apply_fn(params, v))(x)
  program = mark_dependence(flatten(closed, recognise=None), [True])
  widths = [math.prod(input_shape)]
  for e in program.eqns:
    if e.abstract and e.name in _LAYER_PRIMITIVES:
      sizes = [e.invars[p].size for p in e.abstract_pos] + [o.size for o in e.outvars]
      widths.append(int(max(sizes)))
  widths.append(int(sum(math.prod(o.aval.shape) for o in closed.jaxpr.outvars)))
  return tuple(widths)


def dense_bytes(widths: Sequence[int], batch: int, frontier: int) -> int:
  """The dense path's memory estimate in bytes (module docstring): weights and ``|W|``, one
  batch's intermediate backward states and a frontier of ``frontier`` domains, float64."""
  pairs = [a * b for a, b in zip(widths[:-1], widths[1:])]
  weights = 2 * sum(pairs)
  state = batch * 2 * max(pairs)
  front = frontier * 4 * sum(widths[1:-1])
  return 8 * (weights + state + front)


def dense_plan(widths: Sequence[int], budget_bytes: int, batch: int = 256,
               frontier: int = 20_000) -> int:
  """The largest batch of sub-problems (``batch``, halved down to 8) whose dense-path estimate
  fits ``budget_bytes``; 0 when none does (the dense path is skipped)."""
  b = batch
  while b >= 8:
    if dense_bytes(widths, b, frontier) <= budget_bytes:
      return b
    b //= 2
  return 0
