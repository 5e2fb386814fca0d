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

#include <algorithm>
#include <cmath>
#include <cstdint>
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
  std::vector<T> thr_l(d), thr_u(d);
  std::vector<int32_t> at_l(d), at_u(d);
  Slots<T, true> hi{top, thr_l.data(), at_l.data(), k};
  Slots<T, false> lo{bot, thr_u.data(), at_u.data(), k};
  if (k)
    for (int64_t p = 0; p < d; ++p) {
      hi.Init(p);
      lo.Init(p);
    }
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
    for (int64_t q = 0; q < w; ++q) {  // one rounding per chunk into the running sums
      sn[t0 + q] = static_cast<T>(static_cast<double>(sn[t0 + q]) + an[q]);
      sl[t0 + q] = static_cast<T>(static_cast<double>(sl[t0 + q]) + al[q]);
      su[t0 + q] = static_cast<T>(static_cast<double>(su[t0 + q]) + au[q]);
      if (track_abs) sa[t0 + q] = static_cast<T>(static_cast<double>(sa[t0 + q]) + aa[q]);
    }
  }
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

}  // namespace

#define BOUNDJAX_MERGE(NAME, DT)                                       \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, TopkMergeImpl<ffi::DT>,          \
                                ffi::Ffi::Bind()                       \
                                    .Arg<ffi::Buffer<ffi::DT>>()       \
                                    .Arg<ffi::Buffer<ffi::DT>>()       \
                                    .Ret<ffi::Buffer<ffi::DT>>()       \
                                    .Attr<bool>("largest"));

#define BOUNDJAX_ACCUMULATE(NAME, DT)                                  \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, AccumulateImpl<ffi::DT>,         \
                                ffi::Ffi::Bind()                       \
                                    .Arg<ffi::Buffer<ffi::DT>>()       \
                                    .Arg<ffi::Buffer<ffi::DT>>()       \
                                    .Arg<ffi::Buffer<ffi::DT>>()       \
                                    .Arg<ffi::Buffer<ffi::DT>>()       \
                                    .Arg<ffi::Buffer<ffi::DT>>()       \
                                    .Arg<ffi::Buffer<ffi::DT>>()       \
                                    .Arg<ffi::Buffer<ffi::DT>>()       \
                                    .Arg<ffi::Buffer<ffi::DT>>()       \
                                    .Arg<ffi::Buffer<ffi::DT>>()       \
                                    .Ret<ffi::Buffer<ffi::DT>>()       \
                                    .Ret<ffi::Buffer<ffi::DT>>()       \
                                    .Ret<ffi::Buffer<ffi::DT>>()       \
                                    .Ret<ffi::Buffer<ffi::DT>>()       \
                                    .Ret<ffi::Buffer<ffi::DT>>()       \
                                    .Ret<ffi::Buffer<ffi::DT>>()       \
                                    .Attr<bool>("track_abs"));

BOUNDJAX_MERGE(BoundjaxTopkMergeF32, F32)
BOUNDJAX_MERGE(BoundjaxTopkMergeF64, F64)
BOUNDJAX_ACCUMULATE(BoundjaxAccumulateF32, F32)
BOUNDJAX_ACCUMULATE(BoundjaxAccumulateF64, F64)
