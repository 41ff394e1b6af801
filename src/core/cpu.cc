// cpuid-based feature detection.
// GCC 12 warns on its own _mm512_undefined_* inside the intrinsics headers (a false positive; clang has no such
// warning group).
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "core/cpu.h"

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace lathe {

namespace {

uint64_t Xgetbv() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return ((uint64_t)edx << 32) | eax;
}

CpuFeatures Detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (__get_cpuid(0, &a, &b, &c, &d)) f.intel = b == 0x756e6547 && d == 0x49656e69 && c == 0x6c65746e;  // GenuineIntel
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  bool osxsave = c & (1u << 27);
  bool avx = c & (1u << 28);
  f.fma = c & (1u << 12);
  f.f16c = c & (1u << 29);
  uint64_t xcr0 = osxsave ? Xgetbv() : 0;
  bool ymm_ok = (xcr0 & 0x6) == 0x6;
  bool zmm_ok = (xcr0 & 0xe6) == 0xe6;
  bool tiles_ok = (xcr0 & 0x60000) == 0x60000;  // XTILECFG (bit 17) and XTILEDATA (bit 18)
  if (!avx || !ymm_ok) {
    f.fma = f.f16c = false;
    return f;
  }
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = b & (1u << 5);
  f.bmi2 = b & (1u << 8);
  if (tiles_ok) {
    f.amx_bf16 = d & (1u << 22);
    f.amx_tile = d & (1u << 24);
  }
  if (zmm_ok) {
    f.avx512f = b & (1u << 16);
    f.avx512dq = b & (1u << 17);
    f.avx512bw = b & (1u << 30);
    f.avx512vl = b & (1u << 31);
    f.avx512_vnni = c & (1u << 11);
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = a & (1u << 5);
    f.avx_vnni = a & (1u << 4);
  } else {
    __cpuid_count(7, 1, a, b, c, d);
    f.avx_vnni = a & (1u << 4);
  }
  return f;
}

}  // namespace

std::string CpuFeatures::ToString() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(bmi2, "bmi2");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512dq, "avx512dq");
  add(avx512_bf16, "avx512_bf16");
  add(avx512_vnni, "avx512_vnni");
  add(avx_vnni, "avx_vnni");
  add(amx_tile, "amx_tile");
  add(amx_bf16, "amx_bf16");
  return s.empty() ? "none" : s;
}

CpuFeatures DetectCpuFeatures() { return Detect(); }

std::optional<bool> EnvSwitch(const char* name) {
  const char* v = std::getenv(name);
  if (v && !std::strcmp(v, "1")) return true;
  if (v && !std::strcmp(v, "0")) return false;
  return std::nullopt;
}

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures f = Detect();
  return f;
}

bool Splits256BitOps() {
  static const bool split = [] {
    if (const std::optional<bool> forced = EnvSwitch("LATHE_AVX2_SPLIT")) return *forced;
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
    char vendor[13];
    std::memcpy(vendor, &b, 4);
    std::memcpy(vendor + 4, &d, 4);
    std::memcpy(vendor + 8, &c, 4);
    vendor[12] = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    const unsigned base_family = (a >> 8) & 0xf, base_model = (a >> 4) & 0xf;
    const unsigned family = base_family == 0xf ? base_family + ((a >> 20) & 0xff) : base_family;
    const unsigned model = base_family == 0xf ? base_model | (((a >> 16) & 0xf) << 4) : base_model;
    if (!std::strcmp(vendor, "AuthenticAMD")) return family == 0x17 && model < 0x30;
    if (!std::strcmp(vendor, "HygonGenuine")) return family == 0x18;
    return false;
  }();
  return split;
}

IsaTier BestIsaTier() {
  static const IsaTier tier = [] {
    const CpuFeatures& f = GetCpuFeatures();
    IsaTier t = f.HasAvx512Tier() ? IsaTier::kAvx512 : f.HasAvx2Tier() ? IsaTier::kAvx2 : IsaTier::kScalar;
    if (const char* cap = std::getenv("LATHE_ISA")) {
      IsaTier c = t;
      if (!std::strcmp(cap, "scalar")) c = IsaTier::kScalar;
      else if (!std::strcmp(cap, "avx2")) c = IsaTier::kAvx2;
      else if (!std::strcmp(cap, "avx512")) c = IsaTier::kAvx512;
      if ((int)c < (int)t) t = c;
    }
    return t;
  }();
  return tier;
}

bool UsesBf16Dot() {
  static const bool on = [] {
    const char* env = std::getenv("LATHE_BF16_DOT");
    return BestIsaTier() == IsaTier::kAvx512 && GetCpuFeatures().avx512_bf16 && !(env && !std::strcmp(env, "0"));
  }();
  return on;
}

const char* IsaTierName(IsaTier t) {
  switch (t) {
    case IsaTier::kScalar: return "scalar";
    case IsaTier::kAvx2: return "avx2";
    case IsaTier::kAvx512: return "avx512";
  }
  return "?";
}

namespace {

// 12 FMA chains of vector type V (a0 = a0 * m + c each), kept in registers and live by empty asm; a
// macro, not a template: compilers check the register constraints where the body is, and only the
// target-attributed functions below can hold V in a register.
#define LATHE_FMA_CHAINS(V, iters)                                                                              \
  V a0 = V{} + 1, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3, a4 = a0 + 4, a5 = a0 + 5, a6 = a0 + 6, a7 = a0 + 7,      \
    a8 = a0 + 8, a9 = a0 + 9, a10 = a0 + 10, a11 = a0 + 11;                                                    \
  const V m = V{} + 0.999999f, c = V{} + 1e-7f;                                                                \
  const auto t0 = std::chrono::steady_clock::now();                                                            \
  for (long long it = 0; it < (iters); ++it) {                                                                 \
    a0 = a0 * m + c, a1 = a1 * m + c, a2 = a2 * m + c, a3 = a3 * m + c, a4 = a4 * m + c, a5 = a5 * m + c;       \
    a6 = a6 * m + c, a7 = a7 * m + c, a8 = a8 * m + c, a9 = a9 * m + c, a10 = a10 * m + c, a11 = a11 * m + c;   \
    __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5));                         \
    __asm__ volatile("" : "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));                       \
  }                                                                                                            \
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();               \
  volatile float sink = (a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11)[0];                      \
  (void)sink;                                                                                                  \
  return (double)(iters) * 12 * (sizeof(V) / sizeof(float)) * 2 / s * 1e-9;

typedef float V8 __attribute__((vector_size(32)));
typedef float V16 __attribute__((vector_size(64)));

__attribute__((target("avx2,fma"))) double FmaPeakYmm(long long iters) { LATHE_FMA_CHAINS(V8, iters) }

__attribute__((target("avx512f,fma"))) double FmaPeakZmm(long long iters) { LATHE_FMA_CHAINS(V16, iters) }

#undef LATHE_FMA_CHAINS

// 12 vdpbf16ps chains on zmm registers (64 flops each: 16 lanes x 2 products x multiply-add).
__attribute__((target("avx512f,avx512bf16"))) double Bf16DotPeakZmm(long long iters) {
  __m512 a0 = _mm512_set1_ps(1), a1 = _mm512_set1_ps(2), a2 = _mm512_set1_ps(3), a3 = _mm512_set1_ps(4),
         a4 = _mm512_set1_ps(5), a5 = _mm512_set1_ps(6), a6 = _mm512_set1_ps(7), a7 = _mm512_set1_ps(8),
         a8 = _mm512_set1_ps(9), a9 = _mm512_set1_ps(10), a10 = _mm512_set1_ps(11), a11 = _mm512_set1_ps(12);
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3a833a83);  // bf16 ~0.001 pairs: no overflow, no denormals
  const auto t0 = std::chrono::steady_clock::now();
  for (long long it = 0; it < iters; ++it) {
    a0 = _mm512_dpbf16_ps(a0, x, x), a1 = _mm512_dpbf16_ps(a1, x, x), a2 = _mm512_dpbf16_ps(a2, x, x);
    a3 = _mm512_dpbf16_ps(a3, x, x), a4 = _mm512_dpbf16_ps(a4, x, x), a5 = _mm512_dpbf16_ps(a5, x, x);
    a6 = _mm512_dpbf16_ps(a6, x, x), a7 = _mm512_dpbf16_ps(a7, x, x), a8 = _mm512_dpbf16_ps(a8, x, x);
    a9 = _mm512_dpbf16_ps(a9, x, x), a10 = _mm512_dpbf16_ps(a10, x, x), a11 = _mm512_dpbf16_ps(a11, x, x);
    __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5));
    __asm__ volatile("" : "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                   _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)),
                                                 _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11))));
  volatile float sink = _mm512_reduce_add_ps(sum);
  (void)sink;
  return (double)iters * 12 * 64 / s * 1e-9;
}

}  // namespace

double MeasureBf16DotPeakGflops(long long iters) {
  if (!UsesBf16Dot()) return 0;
  return Bf16PairsOnFma() ? FmaPeakZmm(iters) : Bf16DotPeakZmm(iters);
}

bool Bf16PairsOnFmaDefault() {
  static const bool on = [] {
    if (!UsesBf16Dot()) return false;
    // 20k iterations of 12 instructions: ~0.1-0.3 ms per run. The best of 3 interleaved runs of each rides
    // out a clock ramp or a preemption; the two rates differ by 2x either way on the CPUs measured.
    double dp = 0, fma = 0;
    for (int i = 0; i < 3; ++i) {
      dp = std::max(dp, Bf16DotPeakZmm(20'000));
      fma = std::max(fma, FmaPeakZmm(20'000));
    }
    return dp < 0.8 * fma;
  }();
  return on;
}

bool Bf16PairsOnFma() {
  static const bool on = [] {
    if (!UsesBf16Dot()) return false;
    if (const char* env = std::getenv("LATHE_BF16_PAIRS")) {
      if (!std::strcmp(env, "fma")) return true;
      if (!std::strcmp(env, "dp")) return false;
    }
    return Bf16PairsOnFmaDefault();
  }();
  return on;
}

namespace {

// Linux's arch_prctl codes for the dynamically enabled tile state (asm/prctl.h, Linux 5.16+).
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

// The tile configuration of MeasureAmxBf16PeakGflops: palette 1, 8 tiles of 16 rows x 64 bytes.
struct alignas(64) PeakTileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

__attribute__((target("amx-tile,amx-bf16"))) double AmxBf16Peak(long long iters) {
  static const PeakTileConfig cfg;
  alignas(64) static const uint16_t ones[16 * 32] = {};  // zeros: the rate does not depend on the values
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_loadd(6, ones, 64);
  _tile_loadd(7, ones, 64);
  const auto t0 = std::chrono::steady_clock::now();
  for (long long it = 0; it < iters; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  _tile_release();
  return (double)iters * 4 * 16 * 16 * 32 * 2 / s * 1e-9;
}

}  // namespace

bool UsesAmxBf16Default() {
  static const bool on = [] {
    if (!UsesBf16Dot()) return false;
    const CpuFeatures& f = GetCpuFeatures();
    if (!f.amx_tile || !f.amx_bf16) return false;
    // Permission for the process's threads to use the tile data (refused: an old kernel, or a signal stack
    // too small for the larger frames; then the pair tiles run).
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return on;
}

bool UsesAmxBf16() {
  static const bool on = [] {
    if (const char* env = std::getenv("LATHE_BF16_PAIRS")) {
      if (!std::strcmp(env, "fma") || !std::strcmp(env, "dp")) return false;
    }
    return UsesAmxBf16Default();
  }();
  return on;
}

double MeasureAmxBf16PeakGflops(long long iters) { return UsesAmxBf16() ? AmxBf16Peak(iters) : 0.0; }

double MeasureFmaPeakGflops(long long iters) {
  switch (BestIsaTier()) {
    case IsaTier::kAvx512:
      return FmaPeakZmm(iters);
    case IsaTier::kAvx2:
      return FmaPeakYmm(iters);
    default:
      return 0;
  }
}

}  // namespace lathe
