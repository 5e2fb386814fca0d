// Native streaming fold for AGT's descent bound (boundjax.agt.select; AGT, Thm 4.6 in §4.2).
//
// The k extreme values per coordinate are kept in k slots in no particular order, with the
// least extreme of them (the threshold) and its slot tracked per coordinate. A value enters
// only when it is strictly more extreme than the threshold: it replaces that slot, and the
// threshold is recomputed over the k slots. The slots then hold the k extremes of everything
// seen, as a multiset (equal values are interchangeable), whatever the order of arrival; so
// their sum, the only use, is that of lax.top_k over the concatenation. NaN never compares
// more extreme, so it does not enter (the caller's sums carry it).
//
// topk_merge(values: T[f, d], running: T[d, k]) -> T[d, k]; attribute largest.
// accumulate(g_n, d_l, d_u: T[f, d], sum_n, sum_l, sum_u, sum_abs: T[d], top_l, bot_u: T[d, k])
//   -> (sum_n, sum_l, sum_u, sum_abs, top_l, bot_u); attribute track_abs. One pass over a
//   chunk: the running sums (the chunk summed in double in sample order, then added to the
//   running sum with one rounding: at least as accurate as XLA's float32 reduction, which the
//   bounds are compared against) and the k largest lower /
//   k smallest upper bounds. Coordinates are taken in tiles: a tile's sums and thresholds stay
//   in cache while the chunk's rows stream past, each row's segment read contiguously
//   (vectorised sums and threshold tests; the rare replacements are scalar).
// accumulate_outer(zn, zl, zu: T[f, n], dn, dl, du: T[f, m], sums: T[n * m], top_l, bot_u:
//   T[n * m, k]) -> as accumulate; attributes gamma, track_abs. The same fold for a Dense
//   kernel's per-sample gradients, the outer products z_i (x) d_i, from their factors: the box
//   of each entry is the corner product of [zl, zu] and [dl, du] (0 * inf = 0, as
//   boundjax.ibp's product of two boxes; a non-finite z gives the whole line), the nominal value
//   zn * dn, each clipped to [-gamma, gamma]. The products are formed a tile of rows at a time
//   and never written out: memory traffic is O(f * (n + m)) per tile instead of O(f * n * m).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kTile = 512;

template <typename T, bool kLargest>
inline bool Better(T a, T b) {
  return kLargest ? a > b : a < b;
}

// The k slots of one coordinate: the threshold (least extreme slot) and where it is.
template <typename T, bool kLargest>
struct Slots {
  T* slot;      // [d, k]
  T* thr;       // [d]
  int32_t* at;  // [d]
  int64_t k;

  void Init(int64_t p) {
    const T* s = slot + p * k;
    T m = s[0];
    int32_t w = 0;
    for (int32_t j = 1; j < k; ++j) {  // branch-free: the slots' order is data
      const bool b = Better<T, kLargest>(m, s[j]);
      m = b ? s[j] : m;
      w = b ? j : w;
    }
    thr[p] = m;
    at[p] = w;
  }

  inline void Offer(T v, int64_t p) {
    if (!Better<T, kLargest>(v, thr[p])) return;
    slot[p * k + at[p]] = v;
    Init(p);
  }
};

// The k largest lower bounds (hi) and k smallest upper bounds (lo) of d coordinates, their
// thresholds initialised from the running slots.
template <typename T>
struct Extremes {
  std::vector<T> thr_l, thr_u;
  std::vector<int32_t> at_l, at_u;
  Slots<T, true> hi;
  Slots<T, false> lo;

  Extremes(T* top, T* bot, int64_t d, int64_t k)
      : thr_l(d), thr_u(d), at_l(d), at_u(d),
        hi{top, thr_l.data(), at_l.data(), k}, lo{bot, thr_u.data(), at_u.data(), k} {
    if (k)
      for (int64_t p = 0; p < d; ++p) {
        hi.Init(p);
        lo.Init(p);
      }
  }
};

// Calls fn(p) for every p in [t0, t1) with mask[p - t0] != 0, reading the mask 8 bytes at a
// time (most are zero: values rarely beat the threshold).
template <typename Fn>
inline void ForEachSet(const uint8_t* mask, int64_t t0, int64_t t1, Fn fn) {
  const int64_t n = t1 - t0;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    uint64_t w;
    __builtin_memcpy(&w, mask + j, 8);
    while (w) {
      const int bit = __builtin_ctzll(w);
      w &= w - 1;
      fn(t0 + j + bit / 8);
      w &= ~(uint64_t(0xff) << (bit / 8 * 8));
    }
  }
  for (; j < n; ++j)
    if (mask[j]) fn(t0 + j);
}

// The chunk's sums (in double) added to the running sums with one rounding each.
template <typename T>
inline void AddChunkSums(int64_t p0, int64_t w, bool track_abs, const double* an,
                         const double* al, const double* au, const double* aa, T* sn, T* sl,
                         T* su, T* sa) {
  for (int64_t q = 0; q < w; ++q) {
    const int64_t p = p0 + q;
    sn[p] = static_cast<T>(static_cast<double>(sn[p]) + an[q]);
    sl[p] = static_cast<T>(static_cast<double>(sl[p]) + al[q]);
    su[p] = static_cast<T>(static_cast<double>(su[p]) + au[q]);
    if (track_abs) sa[p] = static_cast<T>(static_cast<double>(sa[p]) + aa[q]);
  }
}

template <typename T, bool kLargest>
void Merge(const T* __restrict values, int64_t f, int64_t d, int64_t k, T* out) {
  std::vector<T> thr(d);
  std::vector<int32_t> at(d);
  Slots<T, kLargest> s{out, thr.data(), at.data(), k};
  for (int64_t p = 0; p < d; ++p) s.Init(p);
  uint8_t mask[kTile];
  for (int64_t t0 = 0; t0 < d; t0 += kTile) {
    const int64_t t1 = std::min(t0 + kTile, d);
    for (int64_t i = 0; i < f; ++i) {
      const T* __restrict row = values + i * d;
      const T* __restrict th = s.thr;
      for (int64_t q = t0; q < t1; ++q)
        mask[q - t0] = static_cast<uint8_t>(Better<T, kLargest>(row[q], th[q]));
      ForEachSet(mask, t0, t1, [&](int64_t p) { s.Offer(row[p], p); });
    }
  }
}

template <typename T>
void Accumulate(const T* __restrict gn, const T* __restrict dl, const T* __restrict du,
                int64_t f, int64_t d, int64_t k, bool track_abs, T* __restrict sn,
                T* __restrict sl, T* __restrict su, T* __restrict sa, T* top, T* bot) {
  Extremes<T> ex(top, bot, d, k);
  Slots<T, true>& hi = ex.hi;
  Slots<T, false>& lo = ex.lo;
  uint8_t mask[kTile];
  double an[kTile], al[kTile], au[kTile], aa[kTile];  // a tile's chunk sums, in double
  for (int64_t t0 = 0; t0 < d; t0 += kTile) {
    const int64_t t1 = std::min(t0 + kTile, d);
    const int64_t w = t1 - t0;
    std::fill(an, an + w, 0.0);
    std::fill(al, al + w, 0.0);
    std::fill(au, au + w, 0.0);
    std::fill(aa, aa + w, 0.0);
    for (int64_t i = 0; i < f; ++i) {
      const T* __restrict rn = gn + i * d + t0;
      const T* __restrict rl = dl + i * d + t0;
      const T* __restrict ru = du + i * d + t0;
      for (int64_t q = 0; q < w; ++q) {
        an[q] += rn[q];
        al[q] += rl[q];
        au[q] += ru[q];
      }
      if (track_abs)
        for (int64_t q = 0; q < w; ++q) aa[q] += std::max(std::abs(rl[q]), std::abs(ru[q]));
      rl -= t0;
      ru -= t0;
      if (!k) continue;
      const T* __restrict tl = hi.thr;
      const T* __restrict tu = lo.thr;
      for (int64_t q = t0; q < t1; ++q)
        mask[q - t0] = static_cast<uint8_t>((rl[q] > tl[q]) | ((ru[q] < tu[q]) << 1));
      ForEachSet(mask, t0, t1, [&](int64_t p) {
        hi.Offer(rl[p], p);
        lo.Offer(ru[p], p);
      });
    }
    AddChunkSums(t0, w, track_abs, an, al, au, aa, sn, sl, su, sa);
  }
}


template <typename T>
inline T Clip(T x, T g) {
  return std::min(std::max(x, -g), g);
}



// One row i of a sample's outer product: the clipped corner-product box of [a, b] x [dl, du]
// and the clipped nominal c * dn, for the m entries of the row, added to the tile's sums and
// written to lbo / ubo for the threshold test.
template <typename T>
inline int OuterRow(const T* __restrict rdl, const T* __restrict rdu, const T* __restrict rdn,
                    T a, T b, T c, T g, int64_t m, double* __restrict qn, double* __restrict ql,
                    double* __restrict qu, T* __restrict lbo, T* __restrict ubo,
                    const T* __restrict tl, const T* __restrict tu, uint8_t* __restrict mask) {
  int any = 0;
  for (int64_t j = 0; j < m; ++j) {
    const T x = rdl[j], y = rdu[j];
    T c1 = a * x, c2 = a * y, c3 = b * x, c4 = b * y;
    c1 = c1 == c1 ? c1 : T(0);
    c2 = c2 == c2 ? c2 : T(0);
    c3 = c3 == c3 ? c3 : T(0);
    c4 = c4 == c4 ? c4 : T(0);
    const T m12 = c2 < c1 ? c2 : c1, m34 = c4 < c3 ? c4 : c3;
    const T x12 = c2 > c1 ? c2 : c1, x34 = c4 > c3 ? c4 : c3;
    T l = m34 < m12 ? m34 : m12;
    T h = x34 > x12 ? x34 : x12;
    l = l < -g ? -g : l;  // Clip, keeping NaN as jnp.clip does
    l = l > g ? g : l;
    h = h < -g ? -g : h;
    h = h > g ? g : h;
    T v = c * rdn[j];
    v = v < -g ? -g : v;
    v = v > g ? g : v;
    qn[j] += v;
    ql[j] += l;
    qu[j] += h;
    lbo[j] = l;
    ubo[j] = h;
    const int hit = static_cast<int>(l > tl[j]) | (static_cast<int>(h < tu[j]) << 1);
    mask[j] = static_cast<uint8_t>(hit);
    any |= hit;
  }
  return any;
}

// `OuterRow` where a bound of the row's z is not finite: the box is the whole line, clipped.
template <typename T>
int OuterRowWhole(const T* __restrict rdn, T c, T g, int64_t m, double* __restrict qn,
                  double* __restrict ql, double* __restrict qu, T* __restrict lbo,
                  T* __restrict ubo, const T* __restrict tl, const T* __restrict tu,
                  uint8_t* __restrict mask) {
  int any = 0;
  for (int64_t j = 0; j < m; ++j) {
    qn[j] += Clip(c * rdn[j], g);
    ql[j] += -g;
    qu[j] += g;
    lbo[j] = -g;
    ubo[j] = g;
    const int hit = static_cast<int>(-g > tl[j]) | (static_cast<int>(g < tu[j]) << 1);
    mask[j] = static_cast<uint8_t>(hit);
    any |= hit;
  }
  return any;
}

// The samples in decreasing order of max|z| * max|d| (their largest possible entry): the
// extremes tend to arrive first, so the thresholds rise early and fewer values enter the slots.
// (Which values end in the slots does not depend on the order.)
template <typename T>
std::vector<int64_t> ExtremesFirst(const T* zl, const T* zu, const T* dl, const T* du,
                                   int64_t f, int64_t n, int64_t m) {
  std::vector<double> key(f);
  for (int64_t s = 0; s < f; ++s) {
    T a = 0, b = 0;
    for (int64_t i = 0; i < n; ++i)
      a = std::max(a, std::max(std::abs(zl[s * n + i]), std::abs(zu[s * n + i])));
    for (int64_t j = 0; j < m; ++j)
      b = std::max(b, std::max(std::abs(dl[s * m + j]), std::abs(du[s * m + j])));
    key[s] = static_cast<double>(a) * static_cast<double>(b);
  }
  std::vector<int64_t> order(f);
  for (int64_t s = 0; s < f; ++s) order[s] = s;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return key[x] > key[y]; });
  return order;
}

// Rows [r0, r1) of the kernel, a tile of rows at a time: the tile's sums stay in cache while
// every sample's factors stream past (samples in `order`).
template <typename T>
void OuterRows(const T* __restrict zn, const T* __restrict zl, const T* __restrict zu,
               const T* __restrict dn, const T* __restrict dl, const T* __restrict du,
               const std::vector<int64_t>& order, int64_t n, int64_t m, int64_t k, T gamma,
               bool track_abs, int64_t r0, int64_t r1, Slots<T, true> hi, Slots<T, false> lo,
               T* __restrict sn, T* __restrict sl, T* __restrict su, T* __restrict sa) {
  const int64_t rows = std::max<int64_t>(1, kTile / std::max<int64_t>(m, 1));
  const int64_t cap = rows * m;
  std::vector<double> an(cap), al(cap), au(cap), aa(cap);
  std::vector<T> lb(cap), ub(cap);
  std::vector<uint8_t> mask(cap);
  for (int64_t i0 = r0; i0 < r1; i0 += rows) {
    const int64_t i1 = std::min(i0 + rows, r1);
    const int64_t w = (i1 - i0) * m;
    const int64_t p0 = i0 * m;
    std::fill(an.begin(), an.begin() + w, 0.0);
    std::fill(al.begin(), al.begin() + w, 0.0);
    std::fill(au.begin(), au.begin() + w, 0.0);
    std::fill(aa.begin(), aa.begin() + w, 0.0);
    for (const int64_t s : order) {
      const T* __restrict rdn = dn + s * m;
      const T* __restrict rdl = dl + s * m;
      const T* __restrict rdu = du + s * m;
      for (int64_t i = i0; i < i1; ++i) {
        const T a = zl[s * n + i], b = zu[s * n + i], c = zn[s * n + i];
        const bool whole = !(std::isfinite(a) && std::isfinite(b));
        const int64_t o = (i - i0) * m;
        double* __restrict qn = an.data() + o;
        double* __restrict ql = al.data() + o;
        double* __restrict qu = au.data() + o;
        T* __restrict lbo = lb.data() + o;
        T* __restrict ubo = ub.data() + o;
        const T* tl = hi.thr + p0 + o;
        const T* tu = lo.thr + p0 + o;
        uint8_t* mk = mask.data() + o;
        const int any =
            whole ? OuterRowWhole<T>(rdn, c, gamma, m, qn, ql, qu, lbo, ubo, tl, tu, mk)
                  : OuterRow<T>(rdl, rdu, rdn, a, b, c, gamma, m, qn, ql, qu, lbo, ubo, tl, tu, mk);
        if (track_abs) {
          double* __restrict qa = aa.data() + o;
          for (int64_t j = 0; j < m; ++j) qa[j] += std::max(std::abs(lbo[j]), std::abs(ubo[j]));
        }
        if (k && any)
          ForEachSet(mk, 0, m, [&](int64_t j) {
            hi.Offer(lbo[j], p0 + o + j);
            lo.Offer(ubo[j], p0 + o + j);
          });
      }
    }
    AddChunkSums(p0, w, track_abs, an.data(), al.data(), au.data(), aa.data(), sn, sl, su,
                 sa);
  }
}

template <typename T>
void AccumulateOuter(const T* __restrict zn, const T* __restrict zl, const T* __restrict zu,
                     const T* __restrict dn, const T* __restrict dl, const T* __restrict du,
                     int64_t f, int64_t n, int64_t m, int64_t k, T gamma, bool track_abs,
                     T* __restrict sn, T* __restrict sl, T* __restrict su, T* __restrict sa,
                     T* top, T* bot) {
  const int64_t d = n * m;
  Extremes<T> ex(top, bot, d, k);
  Slots<T, true>& hi = ex.hi;
  Slots<T, false>& lo = ex.lo;
  const std::vector<int64_t> order = ExtremesFirst(zl, zu, dl, du, f, n, m);
  // Rows split between threads (disjoint coordinates: no shared writes) when the work is
  // large enough to pay for starting them.
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t threads = std::min<int64_t>({hw, n, std::max<int64_t>(1, f * d / (1 << 20))});
  auto run = [&](int64_t r0, int64_t r1) {
    OuterRows<T>(zn, zl, zu, dn, dl, du, order, n, m, k, gamma, track_abs, r0, r1, hi, lo, sn,
                 sl, su, sa);
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t)
    pool.emplace_back(run, n * t / threads, n * (t + 1) / threads);
  run(0, n / threads);
  for (auto& th : pool) th.join();
}

template <ffi::DataType DT>
ffi::Error TopkMergeImpl(ffi::Buffer<DT> values, ffi::Buffer<DT> running,
                         ffi::ResultBuffer<DT> out, bool largest) {
  using T = ffi::NativeType<DT>;
  auto rdims = running.dimensions();
  if (rdims.size() != 2) return ffi::Error::InvalidArgument("running must be (d, k)");
  const int64_t d = rdims[0], k = rdims[1];
  auto vdims = values.dimensions();
  if (vdims.size() != 2 || vdims[1] != d)
    return ffi::Error::InvalidArgument("values must be (f, d) with d as in running");
  const int64_t f = vdims[0];
  T* o = out->typed_data();
  std::copy(running.typed_data(), running.typed_data() + d * k, o);
  if (k == 0 || f == 0) return ffi::Error::Success();
  if (largest)
    Merge<T, true>(values.typed_data(), f, d, k, o);
  else
    Merge<T, false>(values.typed_data(), f, d, k, o);
  return ffi::Error::Success();
}

template <ffi::DataType DT>
ffi::Error AccumulateImpl(ffi::Buffer<DT> gn, ffi::Buffer<DT> dl, ffi::Buffer<DT> du,
                          ffi::Buffer<DT> sn, ffi::Buffer<DT> sl, ffi::Buffer<DT> su,
                          ffi::Buffer<DT> sa, ffi::Buffer<DT> top, ffi::Buffer<DT> bot,
                          ffi::ResultBuffer<DT> on, ffi::ResultBuffer<DT> ol,
                          ffi::ResultBuffer<DT> ou, ffi::ResultBuffer<DT> oa,
                          ffi::ResultBuffer<DT> otop, ffi::ResultBuffer<DT> obot,
                          bool track_abs) {
  using T = ffi::NativeType<DT>;
  auto tdims = top.dimensions();
  if (tdims.size() != 2) return ffi::Error::InvalidArgument("top_l must be (d, k)");
  const int64_t d = tdims[0], k = tdims[1];
  auto vdims = dl.dimensions();
  if (vdims.size() != 2 || vdims[1] != d)
    return ffi::Error::InvalidArgument("per-sample values must be (f, d)");
  const int64_t f = vdims[0];
  auto copy = [](const auto& in, auto& out) {
    std::copy(in.typed_data(), in.typed_data() + in.element_count(), out->typed_data());
  };
  copy(sn, on); copy(sl, ol); copy(su, ou); copy(sa, oa); copy(top, otop); copy(bot, obot);
  Accumulate<T>(gn.typed_data(), dl.typed_data(), du.typed_data(), f, d, k, track_abs,
                on->typed_data(), ol->typed_data(), ou->typed_data(), oa->typed_data(),
                otop->typed_data(), obot->typed_data());
  return ffi::Error::Success();
}


template <ffi::DataType DT>
ffi::Error AccumulateOuterImpl(ffi::Buffer<DT> zn, ffi::Buffer<DT> zl, ffi::Buffer<DT> zu,
                               ffi::Buffer<DT> dn, ffi::Buffer<DT> dl, ffi::Buffer<DT> du,
                               ffi::Buffer<DT> sn, ffi::Buffer<DT> sl, ffi::Buffer<DT> su,
                               ffi::Buffer<DT> sa, ffi::Buffer<DT> top, ffi::Buffer<DT> bot,
                               ffi::ResultBuffer<DT> on, ffi::ResultBuffer<DT> ol,
                               ffi::ResultBuffer<DT> ou, ffi::ResultBuffer<DT> oa,
                               ffi::ResultBuffer<DT> otop, ffi::ResultBuffer<DT> obot,
                               double gamma, bool track_abs) {
  using T = ffi::NativeType<DT>;
  auto zdims = zl.dimensions(), ddims = dl.dimensions(), tdims = top.dimensions();
  if (zdims.size() != 2 || ddims.size() != 2 || zdims[0] != ddims[0])
    return ffi::Error::InvalidArgument("factors must be (f, n) and (f, m)");
  const int64_t f = zdims[0], n = zdims[1], m = ddims[1];
  if (tdims.size() != 2 || tdims[0] != n * m)
    return ffi::Error::InvalidArgument("top_l must be (n * m, k)");
  const int64_t k = tdims[1];
  auto copy = [](const auto& in, auto& out) {
    std::copy(in.typed_data(), in.typed_data() + in.element_count(), out->typed_data());
  };
  copy(sn, on); copy(sl, ol); copy(su, ou); copy(sa, oa); copy(top, otop); copy(bot, obot);
  AccumulateOuter<T>(zn.typed_data(), zl.typed_data(), zu.typed_data(), dn.typed_data(),
                     dl.typed_data(), du.typed_data(), f, n, m, k, static_cast<T>(gamma),
                     track_abs, on->typed_data(), ol->typed_data(), ou->typed_data(),
                     oa->typed_data(), otop->typed_data(), obot->typed_data());
  return ffi::Error::Success();
}

}  // namespace

#define BOUNDJAX_ARGS2(DT) .Arg<ffi::Buffer<ffi::DT>>().Arg<ffi::Buffer<ffi::DT>>()
#define BOUNDJAX_ARGS3(DT) BOUNDJAX_ARGS2(DT).Arg<ffi::Buffer<ffi::DT>>()
#define BOUNDJAX_RETS3(DT) .Ret<ffi::Buffer<ffi::DT>>().Ret<ffi::Buffer<ffi::DT>>() \
                           .Ret<ffi::Buffer<ffi::DT>>()

#define BOUNDJAX_MERGE(NAME, DT)                                                      \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, TopkMergeImpl<ffi::DT>,                         \
                                ffi::Ffi::Bind() BOUNDJAX_ARGS2(DT)                   \
                                    .Ret<ffi::Buffer<ffi::DT>>()                      \
                                    .Attr<bool>("largest"));

// (g_n, d_l, d_u, four sums, top_l, bot_u) -> (four sums, top_l, bot_u)
#define BOUNDJAX_ACCUMULATE(NAME, DT)                                                 \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, AccumulateImpl<ffi::DT>,                        \
                                ffi::Ffi::Bind() BOUNDJAX_ARGS3(DT) BOUNDJAX_ARGS3(DT) \
                                    BOUNDJAX_ARGS3(DT) BOUNDJAX_RETS3(DT)             \
                                    BOUNDJAX_RETS3(DT)                                \
                                    .Attr<bool>("track_abs"));

// (zn, zl, zu, dn, dl, du, four sums, top_l, bot_u) -> (four sums, top_l, bot_u)
#define BOUNDJAX_ACCUMULATE_OUTER(NAME, DT)                                           \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, AccumulateOuterImpl<ffi::DT>,                   \
                                ffi::Ffi::Bind() BOUNDJAX_ARGS3(DT) BOUNDJAX_ARGS3(DT) \
                                    BOUNDJAX_ARGS3(DT) BOUNDJAX_ARGS3(DT)             \
                                    BOUNDJAX_RETS3(DT) BOUNDJAX_RETS3(DT)             \
                                    .Attr<double>("gamma")                            \
                                    .Attr<bool>("track_abs"));

BOUNDJAX_MERGE(BoundjaxTopkMergeF32, F32)
BOUNDJAX_MERGE(BoundjaxTopkMergeF64, F64)
BOUNDJAX_ACCUMULATE(BoundjaxAccumulateF32, F32)
BOUNDJAX_ACCUMULATE(BoundjaxAccumulateF64, F64)
BOUNDJAX_ACCUMULATE_OUTER(BoundjaxAccumulateOuterF32, F32)
BOUNDJAX_ACCUMULATE_OUTER(BoundjaxAccumulateOuterF64, F64)
