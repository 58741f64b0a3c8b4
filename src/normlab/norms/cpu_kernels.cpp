// Fused CPU LayerNorm and RMSNorm, forward and backward: normlab's own kernels for impl=cpp.
//
// Built on first use by normlab/norms/cpp_impl.py (torch.utils.cpp_extension.load) with the vector
// ISA inductor picks for this CPU; registered as torch.ops.normlab_cpu.{norm,norm_fwd,norm_bwd}.
// `norm` is what the modules call: its autograd node is a C++ Node (NormBackward, at the end), so a
// call costs one dispatcher round trip instead of a Python autograd.Function (measured ~0.07 ms of
// Python and autograd per call before, more than the kernel itself at 16 rows).
// Semantics are those of reference.py and triton_impl.py (see cpp_impl.py's docstring):
//   LayerNorm (Ba et al. 2016):   y = (x - mean) * rsqrt(var + eps) * w + b, biased variance
//   RMSNorm (Zhang & Sennrich 2019): y = x * rsqrt(mean(x^2) + eps) * w
// x_hat rounded to the input dtype, then times w (rounded to the input dtype by the caller, held
// in fp32), rounded, plus b, rounded, as eager PyTorch does. Statistics and all sums in
// at::opmath_type (fp32; fp64 for fp64). Vector code from ATen's at::vec for the ISA given at build
// time (-DCPU_CAPABILITY_AVX512 / _AVX2); AVX512-BF16 instructions when the CPU has them.
//
// Forward: one row at a time (a row stays in L1): LayerNorm sums x, then (x - mean)^2 (two passes
// over the row, no cancellation), RMSNorm sums x^2 (bf16: vdpbf16ps on the raw input); then one
// pass writes y. The next row's statistics are computed before this row's output, so their
// reduction and square root overlap with it.
// Backward: blocks of ROWS rows. One sweep over the block's columns, a vector of columns at a time,
// loads dy and x once and accumulates, in registers, the per-row sums (g . x_hat, and g for
// LayerNorm) and the block's column sums for dweight (and dbias): dweight costs no extra pass over
// memory. Rows of up to ROW_WISE_BYTES go one at a time instead (a block of 1 row): swept by
// column, a block of short rows is 16 streams of a few cache lines each, too short for the
// hardware prefetcher, and x is cold in a training step (saved in the forward); row by row, x and
// dy are two sequential streams, and the dweight row they add to stays in L1. A second sweep over
// the same rows (now in L1/L2) writes
//   dx = rstd * (g - mean_d(g) - x_hat * mean_d(g * x_hat))   (RMSNorm: without mean_d(g))
// with g = dy * w. Column sums go to one partial row per thread; bwd_call adds the rows in
// thread order, in the accumulation dtype (one thread: straight into dweight / dbias).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/OpMathType.h>
#include <c10/util/irange.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <type_traits>
#include <vector>

#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
#define NORMLAB_BF16_DOT 1  // AVX512-BF16: vdpbf16ps row sums, vcvtneps2bf16 rounding
#endif

namespace {

template <typename T>
using acc_t = at::opmath_type<T>;
template <typename T>
using AVec = at::vec::Vectorized<acc_t<T>>;

constexpr int64_t ROWS = 8;  // rows per backward block: 2 x 8 row accumulators + temporaries fit 32 zmm
// Rows of at most this many bytes go one at a time through the backward (a block of 1): see the
// header. 4096 x 128 fp32 with x cold (as a saved activation is in a training step): 8-row blocks
// 0.63-0.85 ms, one row at a time 0.30-0.44 ms, PyTorch's LayerNorm 0.35-0.56 ms in the same runs;
// warm the same (0.18-0.19 ms); 1024 x 768: 0.80 -> 0.57 ms cold. At 256 x 4096 blocks stay faster (1.01 vs
// 1.46 ms cold): the dweight row a row-at-a-time pass loads and stores is 16 KiB there.
constexpr int64_t ROW_WISE_BYTES = 4096;

template <typename T>
constexpr bool is_reduced = at::is_reduced_floating_point_v<T>;

template <typename T>
inline AVec<T> vload(const T* p) {
  if constexpr (is_reduced<T>) {
    AVec<T> v;
    at::vec::load_to_float<T>(p, v);
    return v;
  } else {
    return AVec<T>::loadu(p);
  }
}

// v rounded to the nearest T (ties to even), kept in the accumulation type. With AVX-512: bf16 by
// vcvtneps2bf16 (AVX512-BF16) or else integer arithmetic on the fp32 bits, fp16 by the F16C round
// trip; no packing.
template <typename T>
inline AVec<T> vround(const AVec<T>& v) {
  if constexpr (!is_reduced<T>) {
    return v;
  } else {
#if defined(CPU_CAPABILITY_AVX512)
    const __m512 f = v;
    if constexpr (std::is_same_v<T, at::BFloat16>) {
#ifdef NORMLAB_BF16_DOT  // one instruction to bf16 (inputs below 1.2e-38 read as 0), two back
      const __m256i h = (__m256i)_mm512_cvtneps_pbh(f);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#else
      const __m512i bits = _mm512_castps_si512(f);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
      const __m512i r = _mm512_and_si512(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))),
                                         _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
      // No NaN fix-up: every NaN here comes from bf16 data or fp32 arithmetic (quiet), so its
      // payload has a bit in the top 7 mantissa bits and stays a NaN after the rounding.
      return _mm512_castsi512_ps(r);
#endif
    } else {
      return _mm512_cvtph_ps(_mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
#else
    auto r = at::vec::convert_from_float<T>(v, v);
    return std::get<0>(at::vec::convert_to_float<T>(r));
#endif
  }
}

// Store v rounded to T (ties to even).
template <typename T>
inline void vstore(T* p, const AVec<T>& v) {
  if constexpr (!is_reduced<T>) {
    v.store(p);
  } else {
#if defined(CPU_CAPABILITY_AVX512)
    if constexpr (std::is_same_v<T, at::BFloat16>) {  // exact after vround: keep the top 16 bits
#ifdef NORMLAB_BF16_DOT
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(static_cast<__m512>(v)));
#else
      const __m512i bits = _mm512_castps_si512(static_cast<__m512>(vround<T>(v)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16)));
#endif
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                          _mm512_cvtps_ph(static_cast<__m512>(v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
#else
    at::vec::convert_from_float<T>(v, v).store(p, AVec<T>::size());
#endif
  }
}

template <typename T>
inline acc_t<T> sround(acc_t<T> v) {
  return static_cast<acc_t<T>>(static_cast<T>(v));
}

template <typename T>
inline acc_t<T> vsum(const AVec<T>& v) {
  return at::vec::vec_reduce_all<acc_t<T>>([](AVec<T>& a, AVec<T>& b) { return a + b; }, v);
}

// Row sums go in blocks of SUM_BLOCK elements: each block is summed in vector registers of the
// accumulation type, the block sums are added in double. The rounding error then grows with the
// block length (4096 elements over 64 lanes: 64 terms per lane), not with d: a 4M-element fp32 row
// summed straight in 64 lanes was 3.6e-6 off (relative), blocked it is ~1e-7, as PyTorch's own.
constexpr int64_t SUM_BLOCK = 4096;

// Sum over a block of (x_j - mu) (SQUARE false) or (x_j - mu)^2 (SQUARE true), four vector
// accumulators.
template <typename T, bool SQUARE>
inline acc_t<T> block_sum(const T* x, int64_t d, acc_t<T> mu) {
  using A = acc_t<T>;
  constexpr int64_t K = AVec<T>::size();
  const AVec<T> vmu(mu);
  auto f = [&](const AVec<T>& v) {
    const AVec<T> c = v - vmu;
    if constexpr (SQUARE) {
      return c * c;
    } else {
      return c;
    }
  };
  AVec<T> s0(0), s1(0), s2(0), s3(0);
  int64_t j = 0;
  for (; j + 4 * K <= d; j += 4 * K) {
    s0 = s0 + f(vload(x + j));
    s1 = s1 + f(vload(x + j + K));
    s2 = s2 + f(vload(x + j + 2 * K));
    s3 = s3 + f(vload(x + j + 3 * K));
  }
  for (; j + K <= d; j += K) s0 = s0 + f(vload(x + j));
  A s = vsum<T>((s0 + s1) + (s2 + s3));
  for (; j < d; ++j) {
    const A c = static_cast<A>(x[j]) - mu;
    s += SQUARE ? c * c : c;
  }
  return s;
}

// The row sum of block_sum over blocks of SUM_BLOCK, the blocks added in double.
template <typename T, bool SQUARE>
inline acc_t<T> row_sum(const T* x, int64_t d, acc_t<T> mu) {
  double total = 0;
  for (int64_t j = 0; j < d; j += SUM_BLOCK) total += block_sum<T, SQUARE>(x + j, std::min(SUM_BLOCK, d - j), mu);
  return static_cast<acc_t<T>>(total);
}

#ifdef NORMLAB_BF16_DOT
// Sum over a bf16 block of x^2 (SQUARE) or of x with vdpbf16ps: 32 bf16 products per instruction,
// each exact in fp32, summed in fp32. The instruction flushes denormals (|x| < 1.2e-38 read as 0,
// squares below 1.2e-38 dropped): immaterial next to any eps that is not itself below 1e-30.
template <bool SQUARE>
inline float block_sum_bf16_dot(const at::BFloat16* x, int64_t d) {
  const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3f80);  // bf16 1.0
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t j = 0;
  for (; j + 128 <= d; j += 128) {  // four independent chains hide the instruction's latency
    for (int k = 0; k < 4; ++k) {
      const __m512bh a = (__m512bh)_mm512_loadu_si512(x + j + 32 * k);
      acc[k] = _mm512_dpbf16_ps(acc[k], a, SQUARE ? a : ones);
    }
  }
  for (; j + 32 <= d; j += 32) {
    const __m512bh a = (__m512bh)_mm512_loadu_si512(x + j);
    acc[0] = _mm512_dpbf16_ps(acc[0], a, SQUARE ? a : ones);
  }
  float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
  for (; j < d; ++j) {
    const float v = static_cast<float>(x[j]);
    s += SQUARE ? v * v : v;
  }
  return s;
}
// The row sum of block_sum_bf16_dot over blocks of SUM_BLOCK (a multiple of 128), in double.
template <bool SQUARE>
inline float row_sum_bf16_dot(const at::BFloat16* x, int64_t d) {
  double total = 0;
  for (int64_t j = 0; j < d; j += SUM_BLOCK) total += block_sum_bf16_dot<SQUARE>(x + j, std::min(SUM_BLOCK, d - j));
  return static_cast<float>(total);
}
#endif

template <typename T, bool RMS>
void fwd_impl(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b, double eps,
              at::Tensor& y, at::Tensor& mean, at::Tensor& rstd) {
  using A = acc_t<T>;
  constexpr int64_t K = AVec<T>::size();
  const int64_t n = x.size(0), d = x.size(1);
  const T* xp = x.const_data_ptr<T>();
  const A* wp = w.const_data_ptr<A>();
  const A* bp = b.has_value() ? b->const_data_ptr<A>() : nullptr;
  T* yp = y.data_ptr<T>();
  A* mp = mean.data_ptr<A>();
  A* rp = rstd.data_ptr<A>();
  // Statistics of row r: mean (0 for RMSNorm) and rstd, stored to mean / rstd.
  auto stats = [&](int64_t r) {
    const T* xr = xp + r * d;
    A mu = 0;
    A sq;
#ifdef NORMLAB_BF16_DOT
    if constexpr (std::is_same_v<T, at::BFloat16>) {  // RMS: x^2 straight from bf16; LN: the row sum
      if constexpr (!RMS) mu = row_sum_bf16_dot<false>(xr, d) / d;
      sq = RMS ? row_sum_bf16_dot<true>(xr, d) : row_sum<T, true>(xr, d, mu);
    } else
#endif
    {
      if constexpr (!RMS) mu = row_sum<T, false>(xr, d, A(0)) / d;
      sq = row_sum<T, true>(xr, d, mu);
    }
    mp[r] = mu;
    rp[r] = A(1) / std::sqrt(sq / d + static_cast<A>(eps));
  };
  at::parallel_for(0, n, 16, [&](int64_t r0, int64_t r1) {
    stats(r0);
    for (int64_t r = r0; r < r1; ++r) {
      // The next row's statistics first: their reduction and square root do not wait for this
      // row's output, so the core overlaps them with it.
      if (r + 1 < r1) stats(r + 1);
      const T* xr = xp + r * d;
      T* yr = yp + r * d;
      const A mu = mp[r], rs = rp[r];
      const AVec<T> vmu(mu), vrs(rs);
      int64_t j = 0;
#pragma GCC unroll 4
      for (; j + K <= d; j += K) {
        const AVec<T> xv = vload(xr + j);
        AVec<T> v = vround<T>((RMS ? xv : xv - vmu) * vrs) * AVec<T>::loadu(wp + j);
        if (bp) v = vround<T>(v) + AVec<T>::loadu(bp + j);  // vstore rounds the last result
        vstore(yr + j, v);
      }
      for (; j < d; ++j) {
        A v = sround<T>((static_cast<A>(xr[j]) - mu) * rs) * wp[j];
        if (bp) v = sround<T>(v) + bp[j];
        yr[j] = static_cast<T>(v);
      }
    }
  });
}

// Backward of NB consecutive rows starting at row r; dwp / dbp: this thread's partial column sums.
template <typename T, bool RMS, int64_t NB>
inline void bwd_block(const T* xp, const T* dyp, const acc_t<T>* wp, const acc_t<T>* mp, const acc_t<T>* rp,
                      T* dxp, acc_t<T>* dwp, acc_t<T>* dbp, int64_t r, int64_t d) {
  using A = acc_t<T>;
  using V = AVec<T>;
  constexpr int64_t K = V::size();
  V sgx[NB], sg[NB], vmu[NB], vrs[NB];
  for (int64_t i = 0; i < NB; ++i) {
    sgx[i] = V(0);
    sg[i] = V(0);
    vmu[i] = V(mp[r + i]);
    vrs[i] = V(rp[r + i]);
  }
  int64_t j = 0;
  for (; j + K <= d; j += K) {  // sweep 1: row sums and the block's column sums, one load each
    const V wv = V::loadu(wp + j);
    V dw(0), db(0);
    for (int64_t i = 0; i < NB; ++i) {
      const int64_t o = (r + i) * d + j;
      const V dyv = vload(dyp + o);
      const V xh = (vload(xp + o) - vmu[i]) * vrs[i];
      const V g = dyv * wv;
      sgx[i] = at::vec::fmadd(g, xh, sgx[i]);
      dw = at::vec::fmadd(dyv, vround<T>(xh), dw);
      if constexpr (!RMS) {
        sg[i] = sg[i] + g;
        db = db + dyv;
      }
    }
    (V::loadu(dwp + j) + dw).store(dwp + j);
    if constexpr (!RMS) (V::loadu(dbp + j) + db).store(dbp + j);
  }
  A c[NB], a[NB];
  for (int64_t i = 0; i < NB; ++i) {
    c[i] = vsum<T>(sgx[i]);
    a[i] = RMS ? A(0) : vsum<T>(sg[i]);
  }
  for (int64_t jt = j; jt < d; ++jt) {  // the columns past the last full vector
    const A wv = wp[jt];
    for (int64_t i = 0; i < NB; ++i) {
      const int64_t o = (r + i) * d + jt;
      const A dyv = static_cast<A>(dyp[o]);
      const A xh = (static_cast<A>(xp[o]) - mp[r + i]) * rp[r + i];
      c[i] += dyv * wv * xh;
      dwp[jt] += dyv * sround<T>(xh);
      if constexpr (!RMS) {
        a[i] += dyv * wv;
        dbp[jt] += dyv;
      }
    }
  }
  for (int64_t i = 0; i < NB; ++i) {  // sweep 2: dx, rows now in cache
    const A cm = c[i] / d, am = a[i] / d, mu = mp[r + i], rs = rp[r + i];
    const V vc(cm), va(am);
    const T* xr = xp + (r + i) * d;
    const T* dyr = dyp + (r + i) * d;
    T* dxr = dxp + (r + i) * d;
    int64_t k = 0;
    for (; k + K <= d; k += K) {
      const V xh = (vload(xr + k) - vmu[i]) * vrs[i];
      V g = vload(dyr + k) * V::loadu(wp + k);
      if constexpr (!RMS) g = g - va;
      vstore(dxr + k, vrs[i] * (g - xh * vc));
    }
    for (; k < d; ++k) {
      const A xh = (static_cast<A>(xr[k]) - mu) * rs;
      const A g = static_cast<A>(dyr[k]) * wp[k] - am;
      dxr[k] = static_cast<T>(rs * (g - xh * cm));
    }
  }
}

// dwb / dbb: the column-sum rows, one per thread (parts rows of d; one row: the outputs themselves).
template <typename T, bool RMS>
void bwd_impl(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w, const at::Tensor& mean,
              const at::Tensor& rstd, at::Tensor& dx, acc_t<T>* dwb, acc_t<T>* dbb) {
  using A = acc_t<T>;
  const int64_t n = x.size(0), d = x.size(1);
  const T* xp = x.const_data_ptr<T>();
  const T* dyp = dy.const_data_ptr<T>();
  const A* wp = w.const_data_ptr<A>();
  const A* mp = mean.const_data_ptr<A>();
  const A* rp = rstd.const_data_ptr<A>();
  T* dxp = dx.data_ptr<T>();
  const int64_t blocks = (n + ROWS - 1) / ROWS;
  const bool row_wise = d * static_cast<int64_t>(sizeof(T)) <= ROW_WISE_BYTES;
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    const int64_t t = at::get_thread_num();
    A* dwp = dwb + t * d;
    A* dbp = RMS ? nullptr : dbb + t * d;
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t r = blk * ROWS;
      if (!row_wise && r + ROWS <= n) {
        bwd_block<T, RMS, ROWS>(xp, dyp, wp, mp, rp, dxp, dwp, dbp, r, d);
      } else {
        for (int64_t rr = r; rr < std::min(n, r + ROWS); ++rr) bwd_block<T, RMS, 1>(xp, dyp, wp, mp, rp, dxp, dwp, dbp, rr, d);
      }
    }
  });
}

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous() && t.device().is_cpu(),
              "normlab_cpu: ", name, " must be a contiguous CPU (rows, d) tensor, got sizes ", t.sizes());
}

void check_vec(const at::Tensor& t, const at::Tensor& x, const char* name) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == x.size(1) && t.is_contiguous() && t.scalar_type() == at::toOpMathType(x.scalar_type()),
              "normlab_cpu: ", name, " must be a contiguous (d,) tensor in x's accumulation dtype");
}

#define NORMLAB_DISPATCH(dtype, RMS, FN, ...)                                                    \
  switch (dtype) {                                                                             \
    case at::kFloat: FN<float, RMS>(__VA_ARGS__); break;                                       \
    case at::kDouble: FN<double, RMS>(__VA_ARGS__); break;                                     \
    case at::kBFloat16: FN<at::BFloat16, RMS>(__VA_ARGS__); break;                             \
    case at::kHalf: FN<at::Half, RMS>(__VA_ARGS__); break;                                     \
    default: TORCH_CHECK(false, "normlab_cpu: dtype ", dtype, " not supported (fp32, fp64, bf16, fp16)"); \
  }

// x (rows, d); weight (d,) (ones when the norm has no weight) and bias (d,) or None: values of x's
// dtype held in the accumulation dtype (converted once per call, not once per row).
// Returns y (rows, d) in x's dtype, mean and rstd (rows,) in the accumulation dtype (mean 0 for RMS).
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_fwd(const at::Tensor& x, const at::Tensor& weight,
                                                        const c10::optional<at::Tensor>& bias, double eps, bool rms) {
  check_rows(x, "x");
  check_vec(weight, x, "weight");
  if (bias.has_value()) check_vec(*bias, x, "bias");
  TORCH_CHECK(eps > 0, "normlab_cpu: eps must be > 0, got ", eps);
  auto acc = at::toOpMathType(x.scalar_type());
  auto y = at::empty_like(x);
  auto mean = at::empty({x.size(0)}, x.options().dtype(acc));
  auto rstd = at::empty({x.size(0)}, x.options().dtype(acc));
  if (rms) {
    NORMLAB_DISPATCH(x.scalar_type(), true, fwd_impl, x, weight, bias, eps, y, mean, rstd)
  } else {
    NORMLAB_DISPATCH(x.scalar_type(), false, fwd_impl, x, weight, bias, eps, y, mean, rstd)
  }
  return {y, mean, rstd};
}

// Returns dx (rows, d) in x's dtype, dweight (d,) and dbias (d,) in the accumulation dtype (dbias
// empty, (0,), for RMS). One thread: the kernel accumulates the column sums straight into dweight
// and dbias. More: into one zeroed partial row per thread (a plain buffer, no tensor), then summed
// into the outputs in thread order (fixed threads: bit-identical results). No other allocation: at
// 16 rows the call's fixed cost is what decides the cheapest norm.
template <typename T, bool RMS>
void bwd_call(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w, const at::Tensor& mean,
              const at::Tensor& rstd, at::Tensor& dx, at::Tensor& dw, at::Tensor& db) {
  using A = acc_t<T>;
  const int64_t d = x.size(1), nt = at::get_num_threads();
  A* dwo = dw.data_ptr<A>();
  A* dbo = RMS ? nullptr : db.data_ptr<A>();
  if (nt == 1) {
    std::fill_n(dwo, d, A(0));
    if constexpr (!RMS) std::fill_n(dbo, d, A(0));
    bwd_impl<T, RMS>(dy, x, w, mean, rstd, dx, dwo, dbo);
    return;
  }
  std::vector<A> part((RMS ? 1 : 2) * nt * d, A(0));
  A* dwb = part.data();
  A* dbb = RMS ? nullptr : dwb + nt * d;
  bwd_impl<T, RMS>(dy, x, w, mean, rstd, dx, dwb, dbb);
  auto sum_rows = [&](A* out, const A* rows) {  // out = rows[0] + rows[1] + ..., in thread order
    std::copy_n(rows, d, out);
    for (int64_t t = 1; t < nt; ++t)
      for (int64_t j = 0; j < d; ++j) out[j] += rows[t * d + j];
  };
  sum_rows(dwo, dwb);
  if constexpr (!RMS) sum_rows(dbo, dbb);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_bwd(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
                                                        const at::Tensor& mean, const at::Tensor& rstd, bool rms) {
  check_rows(x, "x");
  check_rows(dy, "dy");
  TORCH_CHECK(dy.sizes() == x.sizes() && dy.scalar_type() == x.scalar_type(), "normlab_cpu: dy must match x");
  check_vec(weight, x, "weight");
  const auto opts = x.options().dtype(at::toOpMathType(x.scalar_type()));
  const int64_t d = x.size(1);
  auto dx = at::empty_like(x);
  auto dw = at::empty({d}, opts);
  auto db = at::empty({rms ? 0 : d}, opts);
  if (rms) {
    NORMLAB_DISPATCH(x.scalar_type(), true, bwd_call, dy, x, weight, mean, rstd, dx, dw, db)
  } else {
    NORMLAB_DISPATCH(x.scalar_type(), false, bwd_call, dy, x, weight, mean, rstd, dx, dw, db)
  }
  return {dx, dw, db};
}

// ----------------------------------------------------------------------------- the op `norm`
// norm(x (..., d), weight (d,)?, bias (d,)?, eps, rms) -> y (..., d) in x's dtype. The weight and
// bias are rounded to x's dtype and held in the accumulation dtype (ones for no weight); x goes to
// contiguous (rows, d). norm_fwd / norm_bwd are called through the dispatcher, so torch.compile
// traces them with their fake implementations (cpp_impl._register_fakes).

using Triple = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

Triple call_fwd(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b, double eps, bool rms) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("normlab_cpu::norm_fwd", "").typed<decltype(norm_fwd)>();
  return op.call(x, w, b, eps, rms);
}

Triple call_bwd(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w, const at::Tensor& mean,
                const at::Tensor& rstd, bool rms) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("normlab_cpu::norm_bwd", "").typed<decltype(norm_bwd)>();
  return op.call(dy, x, w, mean, rstd, rms);
}

// A weight or bias as the kernels take it: rounded to x's dtype, held in the accumulation dtype,
// contiguous (no op at all when all three dtypes agree, fp32 or fp64, and it is contiguous).
at::Tensor as_kernel_param(const at::Tensor& p, const at::Tensor& x, at::ScalarType acc) {
  at::Tensor q = p.scalar_type() == acc && x.scalar_type() == acc ? p : p.to(x.scalar_type()).to(acc);
  return q.is_contiguous() ? q : q.contiguous();
}

// (x as contiguous (rows, d), weight and bias as the kernel takes them).
Triple prepare(const at::Tensor& x, const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() >= 1, "normlab_cpu: x must have a last dimension to normalize");
  const int64_t d = x.size(-1);
  const auto acc = at::toOpMathType(x.scalar_type());
  auto x2d = x.dim() == 2 && x.is_contiguous() ? x : x.reshape({-1, d}).contiguous();
  auto w = weight.has_value() && weight->defined() ? as_kernel_param(*weight, x, acc) : at::ones({d}, x.options().dtype(acc));
  at::Tensor b;
  if (bias.has_value() && bias->defined()) b = as_kernel_param(*bias, x, acc);
  return {x2d, w, b};
}

c10::optional<at::Tensor> opt(const at::Tensor& t) {
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

// The backward node, written as PyTorch's generated ones are (a Node with SavedVariables), not as
// a torch::autograd::Function: that one demangles its type name on every backward call.
struct NormBackward : public torch::autograd::Node {
  torch::autograd::SavedVariable x2d_, w_, mean_, rstd_;
  bool rms_ = false;
  c10::optional<at::ScalarType> w_dtype_, b_dtype_;  // the parameters' dtypes; none: no parameter

  std::string name() const override { return "NormlabNormBackward"; }

  void release_variables() override {
    x2d_.reset_data();
    w_.reset_data();
    mean_.reset_data();
    rstd_.reset_data();
  }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    // Grad mode is on in a backward only under create_graph=True, which a fused backward cannot honour.
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "norm.impl=cpp has no double backward (create_graph=True): its backward is a fused kernel; "
                "use norm.impl=reference, torch or compiled");
    torch::autograd::variable_list out(3);
    const at::Tensor& dy = grads[0];
    if (!dy.defined()) return out;
    const auto self = getptr();
    const at::Tensor x2d = x2d_.unpack(self);
    // Grad mode is off here, so nothing below needs the Autograd or ADInplaceOrView kernels: skip
    // them (as norm_autograd does), and skip the reshapes and casts that would change nothing.
    at::AutoDispatchBelowADInplaceOrView guard;
    const bool same = dy.sizes() == x2d.sizes();
    const at::Tensor dy2d = same ? dy.contiguous() : dy.reshape(x2d.sizes()).contiguous();
    auto [dx, dw, db] = call_bwd(dy2d, x2d, w_.unpack(self), mean_.unpack(self), rstd_.unpack(self), rms_);
    if (task_should_compute_output(0)) out[0] = same ? dx : dx.view(dy.sizes());
    if (w_dtype_ && task_should_compute_output(1)) out[1] = dw.scalar_type() == *w_dtype_ ? dw : dw.to(*w_dtype_);
    if (b_dtype_ && task_should_compute_output(2)) out[2] = db.scalar_type() == *b_dtype_ ? db : db.to(*b_dtype_);
    return out;
  }
};

c10::optional<at::ScalarType> dtype_of(const c10::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? c10::optional<at::ScalarType>(t->scalar_type()) : c10::nullopt;
}

// The Autograd key: the kernels below autograd, then (when grad mode is on and an input requires
// grad) a NormBackward node as y's grad_fn, with edges to x, weight and bias.
at::Tensor norm_autograd(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                         const c10::optional<at::Tensor>& bias, double eps, bool rms) {
  at::Tensor x2d, w, b, y, mean, rstd;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(x2d, w, b) = prepare(x, weight, bias);
    std::tie(y, mean, rstd) = call_fwd(x2d, w, opt(b), eps, rms);
    if (x.dim() != 2) y = y.view(x.sizes());
  }
  if (torch::autograd::compute_requires_grad(x, weight, bias)) {
    auto node = c10::make_intrusive<NormBackward>();
    node->set_next_edges(torch::autograd::collect_next_edges(x, weight, bias));
    node->x2d_ = torch::autograd::SavedVariable(x2d, false);
    node->w_ = torch::autograd::SavedVariable(w, false);
    node->mean_ = torch::autograd::SavedVariable(mean, false);
    node->rstd_ = torch::autograd::SavedVariable(rstd, false);
    node->rms_ = rms;
    node->w_dtype_ = dtype_of(weight);
    node->b_dtype_ = dtype_of(bias);
    torch::autograd::set_history(y, node);
  }
  return y;
}

// Below autograd (inference mode, or called with autograd already handled): the forward only.
at::Tensor norm_plain(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                      const c10::optional<at::Tensor>& bias, double eps, bool rms) {
  auto [x2d, w, b] = prepare(x, weight, bias);
  auto y = std::get<0>(call_fwd(x2d, w, opt(b), eps, rms));
  return x.dim() == 2 ? y : y.view(x.sizes());
}

}  // namespace

TORCH_LIBRARY(normlab_cpu, m) {
  m.def("norm(Tensor x, Tensor? weight, Tensor? bias, float eps, bool rms) -> Tensor");
  m.def("norm_fwd(Tensor x, Tensor weight, Tensor? bias, float eps, bool rms) -> (Tensor, Tensor, Tensor)");
  m.def("norm_bwd(Tensor dy, Tensor x, Tensor weight, Tensor mean, Tensor rstd, bool rms) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(normlab_cpu, CPU, m) {
  m.impl("norm", norm_plain);
  m.impl("norm_fwd", norm_fwd);
  m.impl("norm_bwd", norm_bwd);
}

TORCH_LIBRARY_IMPL(normlab_cpu, Autograd, m) {
  m.impl("norm", norm_autograd);
}
