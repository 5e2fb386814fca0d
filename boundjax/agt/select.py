"""The running top-k of AGT's streaming descent bound (AGT, Thm 4.6 in §4.2, streaming form).

Thm 4.6 needs, per parameter coordinate, the sum of the k largest per-sample lower bounds (and
of the k smallest upper bounds) over the batch: ``SEMin_{b-k}(delta_L) = sum - topk_k``. The
batch is streamed in chunks and each chunk's values are merged into a running top-k of shape
(*leaf, k) (`merge`):

* on CPU, a native merge (``_topk_merge.cc``, an XLA FFI custom call compiled once with the
  system C++ compiler and cached): the k extremes are kept in k slots with the least extreme
  of them (the threshold) tracked, and a value enters only when it is strictly more extreme
  than the threshold (a vectorised test over each row of the chunk, then a scalar
  replacement), so the merge reads the chunk once, O(f * d) comparisons plus about
  k (1 + ln(b / k)) replacements per coordinate and batch in random order, instead of a
  selection over k + f candidates per coordinate (``lax.top_k`` on XLA's CPU back-end costs
  about 0.5 us per row whatever its length, i.e. 20 ms per merge for the 38,601 coordinates
  of a 384-100-1 network); `accumulate` folds the running sums into the same pass;
* for a Dense kernel, whose per-sample values are outer products ``z_i ⊗ d_i``,
  `accumulate_outer` folds them from their factors (O(f · width) values per chunk): each
  product, its box (corner products) and clipping are formed in registers a tile of rows at a
  time, never written out, samples taken largest first (fewer replacements) and rows split
  between threads;
* elsewhere (another back-end, another dtype, no compiler, or ``BOUNDJAX_NATIVE=0``), the exact
  two-level selection of `topk_leading`.

Both give the same k values per coordinate (the k extremes of the running values and the
chunk, as a multiset; equal values are interchangeable), the native merge in no particular
order within the last axis, `topk_leading` sorted. Only their sum is used (Thm 4.6's
``sum - topk_k``), so the bounds do not depend on which merge ran, nor on the chunk size.
"""

from __future__ import annotations

import ctypes
import math
import hashlib
import os
import pathlib
import subprocess
import sys
import tempfile
import threading

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

_SOURCE = pathlib.Path(__file__).with_name("_topk_merge.cc")
_TARGETS = {np.dtype(np.float32): "boundjax_topk_merge_f32",
            np.dtype(np.float64): "boundjax_topk_merge_f64"}
_lock = threading.Lock()
_state: dict = {}


def _cache_dir() -> pathlib.Path:
  root = os.environ.get("BOUNDJAX_CACHE") or os.environ.get("XDG_CACHE_HOME") or "~/.cache"
  return pathlib.Path(root).expanduser() / "boundjax"


def _cpu_flags() -> bytes:
  """The CPU's feature flags (Linux), so that a library built with ``-march=native`` is never
  loaded on a machine that lacks its instructions (a cache directory shared between hosts)."""
  try:
    with open("/proc/cpuinfo", "rb") as f:
      return next((line for line in f if line.startswith(b"flags")), b"")
  except OSError:
    import platform
    return platform.processor().encode()


def _build() -> pathlib.Path:
  """Compiles ``_topk_merge.cc`` into the cache (once per source, jaxlib version and
  machine) and returns the shared library's path."""
  import jaxlib
  src = _SOURCE.read_bytes()
  key = hashlib.sha256(src + jaxlib.__version__.encode() + os.uname().machine.encode()
                       + sys.version.encode() + _cpu_flags()).hexdigest()[:16]
  out = _cache_dir() / f"topk_merge_{key}.so"
  if out.exists():
    return out
  out.parent.mkdir(parents=True, exist_ok=True)
  cxx = os.environ.get("CXX", "c++")
  with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
    tmp_out = pathlib.Path(tmp) / out.name
    subprocess.run([cxx, "-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-pthread", "-w",
                    "-I", jax.ffi.include_dir(), str(_SOURCE), "-o", str(tmp_out)],
                   check=True, capture_output=True)
    os.replace(tmp_out, out)      # atomic: a concurrent build leaves one complete file
  _remove_stale_builds(out)
  return out


STALE_BUILD_SECONDS = 24 * 3600


def _remove_stale_builds(keep: pathlib.Path) -> None:
  """Deletes the cache's other builds older than `STALE_BUILD_SECONDS` (earlier sources or
  jaxlib versions; a build another host of a shared cache still uses is rebuilt there if
  needed). A process that has one loaded keeps its mapping."""
  import time
  now = time.time()
  for old in keep.parent.glob("topk_merge_*.so"):
    try:
      if old != keep and now - old.stat().st_mtime > STALE_BUILD_SECONDS:
        old.unlink()
    except OSError:
      pass


def native_available() -> bool:
  """True when the native merge is built and registered (built on first call; False when
  ``BOUNDJAX_NATIVE=0``, or when compiling or loading it failed)."""
  if os.environ.get("BOUNDJAX_NATIVE", "1") == "0":
    return False
  with _lock:
    if "ok" not in _state:
      try:
        lib = ctypes.cdll.LoadLibrary(str(_build()))
        for name, sym in (("boundjax_topk_merge_f32", "BoundjaxTopkMergeF32"),
                          ("boundjax_topk_merge_f64", "BoundjaxTopkMergeF64"),
                          ("boundjax_accumulate_f32", "BoundjaxAccumulateF32"),
                          ("boundjax_accumulate_f64", "BoundjaxAccumulateF64"),
                          ("boundjax_accumulate_outer_f32", "BoundjaxAccumulateOuterF32"),
                          ("boundjax_accumulate_outer_f64", "BoundjaxAccumulateOuterF64"),
                          ("boundjax_accumulate_poison_f32", "BoundjaxAccumulatePoisonF32"),
                          ("boundjax_accumulate_poison_f64", "BoundjaxAccumulatePoisonF64")):
          jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, sym)),
                                      platform="cpu")
        _state["ok"] = True
      except (OSError, subprocess.CalledProcessError, AttributeError) as e:
        _state["ok"] = False
        _state["error"] = repr(e)
    return _state["ok"]


def use_native(dtype) -> bool:
  """True when the native merge runs for arrays of ``dtype`` (float32 or float64, CPU
  back-end, `native_available`)."""
  return (np.dtype(dtype) in _TARGETS and jax.default_backend() == "cpu"
          and native_available())


def merge(values: Array, running: Array, largest: bool = True) -> Array:
  """The k most extreme of ``running`` and ``values`` per coordinate, shape (*rest, k).

  Args:
    values: one chunk, shape (f, *rest) (leading axis = samples).
    running: the running extremes, shape (*rest, k), in any order along the last axis;
      ``-inf`` (``+inf``) fill empty slots.
    largest: keep the k largest (else the k smallest).

  Returns the k extremes of the union (the values of ``lax.top_k`` over the concatenation, as
  a multiset per coordinate), by the native merge on CPU (in no particular order) and
  `topk_leading` otherwise (sorted; module docstring).
  """
  f = values.shape[0]
  rest = values.shape[1:]
  k = running.shape[-1]
  if k == 0:
    return running
  if not use_native(values.dtype):
    return topk_leading(values, k, running, largest)
  d = int(np.prod(rest, dtype=np.int64))
  call = jax.ffi.ffi_call(_TARGETS[np.dtype(values.dtype)],
                          jax.ShapeDtypeStruct((d, k), values.dtype),
                          vmap_method="sequential")
  out = call(values.reshape(f, d), running.reshape(d, k).astype(values.dtype),
             largest=bool(largest))
  return out.reshape(rest + (k,))


def accumulate(g_n: Array, d_l: Array, d_u: Array, sums: tuple[Array, Array, Array, Array],
               top_l: Array, bot_u: Array, track_abs: bool = True
               ) -> tuple[Array, Array, Array, Array, Array, Array]:
  """One chunk folded into the running state of Thm 4.6's streaming bound, natively in one
  pass (call only when `use_native`; `boundjax.agt.descent.accumulate` is the reference).

  Args:
    g_n, d_l, d_u: the chunk's clipped nominal gradients and their lower / upper bounds, shape
      (f, *leaf).
    sums: running ``(sum_n, sum_l, sum_u, sum_abs)``, each shaped like the leaf.
    top_l, bot_u: the running k largest lower / k smallest upper bounds, (*leaf, k), in any
      order along the last axis.
    track_abs: also add ``max(|d_l|, |d_u|)`` to ``sum_abs`` (else it is returned as given).

  Returns ``(sum_n, sum_l, sum_u, sum_abs, top_l, bot_u)``: the sums by recursive summation in
  sample order (within the error bound `boundjax.agt.descent.rounding_margin` assumes for any
  order) and the same extremes as `merge`.
  """
  f = d_l.shape[0]
  rest = d_l.shape[1:]
  k = top_l.shape[-1]
  d = int(np.prod(rest, dtype=np.int64))
  dt = d_l.dtype
  flat = lambda a: a.reshape(d).astype(dt)  # noqa: E731
  name = {np.dtype(np.float32): "boundjax_accumulate_f32",
          np.dtype(np.float64): "boundjax_accumulate_f64"}[np.dtype(dt)]
  vec, mat = jax.ShapeDtypeStruct((d,), dt), jax.ShapeDtypeStruct((d, k), dt)
  call = jax.ffi.ffi_call(name, (vec, vec, vec, vec, mat, mat), vmap_method="sequential")
  out = call(g_n.reshape(f, d).astype(dt), d_l.reshape(f, d), d_u.reshape(f, d).astype(dt),
             *(flat(a) for a in sums), top_l.reshape(d, k).astype(dt),
             bot_u.reshape(d, k).astype(dt), track_abs=bool(track_abs))
  return (*(o.reshape(rest) for o in out[:4]), out[4].reshape(rest + (k,)),
          out[5].reshape(rest + (k,)))


def _fold_factors(name: str, factors: list, gamma: float, sums: tuple, top: Array, bot: Array,
                  track_abs: bool, n: int, m: int) -> tuple:
  """Calls the native fold ``name`` (f32/f64 suffix added) on a Dense kernel's factors and the
  running state of its (n, m) leaf; returns the state reshaped to the leaf."""
  k = top.shape[-1]
  dt = factors[2].dtype
  if not use_native(dt):
    raise RuntimeError(f"{name}: no native fold for {dt} here (see use_native).")
  suffix = {np.dtype(np.float32): "_f32", np.dtype(np.float64): "_f64"}[np.dtype(dt)]
  vec, mat = jax.ShapeDtypeStruct((n * m,), dt), jax.ShapeDtypeStruct((n * m, k), dt)
  call = jax.ffi.ffi_call("boundjax_" + name + suffix, (vec, vec, vec, vec, mat, mat),
                          vmap_method="sequential")
  cast = lambda a: jnp.asarray(a).astype(dt)  # noqa: E731
  out = call(*(cast(a) for a in factors), *(cast(a).reshape(n * m) for a in sums),
             cast(top).reshape(n * m, k), cast(bot).reshape(n * m, k), gamma=float(gamma),
             track_abs=bool(track_abs))
  return (*(o.reshape(n, m) for o in out[:4]), out[4].reshape(n, m, k),
          out[5].reshape(n, m, k))


def accumulate_outer(z_n: Array, d_n: Array, z_lu: tuple[Array, Array], d_lu: tuple[Array, Array],
                     gamma: float, sums: tuple[Array, Array, Array, Array], top_l: Array,
                     bot_u: Array, track_abs: bool = True
                     ) -> tuple[Array, Array, Array, Array, Array, Array]:
  """`accumulate` for a Dense kernel's per-sample gradients ``z_i ⊗ d_i``, from their factors,
  without forming the (f, n, m) products (call only when `use_native`).

  Args:
    z_n, d_n: the nominal factors, (f, n) and (f, m): the nominal per-sample gradient is
      ``Clip_gamma(z_n[i, :, None] * d_n[i, None, :])``.
    z_lu, d_lu: the factors' boxes ``(lower, upper)``, (f, n) and (f, m): the per-sample box is
      ``Clip_gamma`` of their corner product (``boundjax.ibp``'s product of two boxes, ``0 · ∞ =
      0``; a non-finite ``z`` bound gives the whole line, never narrower than the engine).
    gamma: the clipping level (``math.inf``: none).
    sums, top_l, bot_u, track_abs: as in `accumulate`, for the (n, m) leaf.

  Returns the same values as `accumulate` on the formed, clipped products (the same extremes;
  the sums of the same values, taken in another order).
  """
  n, m = z_lu[0].shape[1], d_lu[0].shape[1]
  return _fold_factors("accumulate_outer", [z_n, z_lu[0], z_lu[1], d_n, d_lu[0], d_lu[1]],
                       gamma, sums, top_l, bot_u, track_abs, n, m)


def accumulate_poison(z_n: Array, d_n: Array, clean: tuple, poisoned: tuple, gamma: float,
                      sums: tuple[Array, Array, Array, Array], top_du: Array, bot_dl: Array,
                      track_abs: bool = True
                      ) -> tuple[Array, Array, Array, Array, Array, Array]:
  """The poisoning fold (`boundjax.agt.poisoning.accumulate`) of a Dense kernel from its
  factors, natively (call only when `use_native`).

  Args:
    z_n, d_n: the nominal factors, as in `accumulate_outer`.
    clean, poisoned: ``((z_lower, z_upper), (d_lower, d_upper))``: the factor boxes of the
      clean bounds ``wp`` and of the poisoned bounds ``iwp``.
    sums: running ``(sum_n, sum_l, sum_u, sum_abs)``: the nominal and clean sums, and of the
      largest magnitude of the four clipped ends (``track_abs``).
    top_du, bot_dl: the running k largest ``max(iwp_U - wp_U, 0)`` and k smallest
      ``min(iwp_L - wp_L, 0)``, (n, m, k), in any order.
  """
  (zl, zu), (dl, du) = clean
  (pzl, pzu), (pdl, pdu) = poisoned
  return _fold_factors("accumulate_poison", [z_n, d_n, zl, zu, dl, du, pzl, pzu, pdl, pdu],
                       gamma, sums, top_du, bot_dl, track_abs, zl.shape[1], dl.shape[1])


def _group_size(f: int, k: int) -> int:
  """Group size g of `topk_leading`: about sqrt(f / k) (balances the two selections), leaning
  small (the gather of k groups costs more per value than the group maxima), and a divisor of f
  where one is near, so that no padding copy is needed."""
  target = max(1.0, 0.7 * math.sqrt(f / max(k, 1)))
  divs = [g for g in range(max(1, int(target / 2)), int(2 * target) + 1) if f % g == 0]
  return min(divs, key=lambda g: abs(math.log(g / target))) if divs else max(1, round(target))


def topk_leading(values: Array, k: int, extra: Array | None = None, largest: bool = True
                 ) -> Array:
  """The k largest of ``values`` along the leading axis, per coordinate, shape (*rest, k).

  With ``largest=False`` the k smallest (in increasing order), without negating ``values``.

  Exact (the same multiset as ``lax.top_k`` on the transposed array) but cheaper for k << f:
  the f samples are split into groups of g ~ sqrt(f / k); only the k groups with the largest
  maxima can hold a top-k value. (If a top-k value x lay in another group, the k selected
  groups would each hold a maximum >= x, and those k maxima can replace every such x without
  lowering the sum; so the k largest of the selected groups have the same values.) Then
  ``lax.top_k`` runs over k * g candidates per coordinate instead of f, and the (f, d) array is
  never transposed. ``extra`` (shape (*rest, m), e.g. a running top-k) joins the candidates.
  Padding uses -inf, so it is never preferred to a real value.
  """
  f = values.shape[0]
  rest = values.shape[1:]
  v = values.reshape(f, -1)
  sgn = 1 if largest else -1
  g = _group_size(f, k)
  ng = -(-f // g)
  if ng <= k or g == 1:
    cand = v.T
  else:
    pad = ng * g - f
    if pad:
      v = jnp.concatenate([v, jnp.full((pad, v.shape[1]), -sgn * jnp.inf, v.dtype)], 0)
    vg = v.reshape(ng, g, -1)
    ext = jnp.max(vg, axis=1) if largest else jnp.min(vg, axis=1)
    best = jax.lax.top_k(sgn * ext.T, k)[1]                        # (d, k) group indices
    sel = jnp.take_along_axis(vg, best.T[:, None, :], axis=0)       # (k, g, d)
    cand = sel.reshape(k * g, -1).T
  if extra is not None:
    cand = jnp.concatenate([extra.reshape(cand.shape[0], -1), cand], -1)
  return (sgn * jax.lax.top_k(sgn * cand, k)[0]).reshape(rest + (k,))
