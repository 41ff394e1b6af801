// Run-time CPU feature detection (cpuid + xgetbv). Kernels dispatch on these.
#pragma once

#include <optional>
#include <string>

namespace lathe {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool bmi2 = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_bf16 = false;
  bool avx512_vnni = false;
  bool avx_vnni = false;
  // AMX tiles with bf16 products (Sapphire Rapids and later Xeons): cpuid and the OS's XCR0 tile state. Using
  // them also needs the kernel's per-process permission (UsesAmxBf16 asks for it).
  bool amx_tile = false;
  bool amx_bf16 = false;
  // Vendor GenuineIntel (tuning only: the training GEMM's sub-chunks, kernels/cpu/train_matmul.cc).
  bool intel = false;
  // Convenience: the full set each kernel tier is compiled for (LATHE_AVX2_FLAGS and
  // LATHE_AVX512_FLAGS in CMakeLists.txt). The AVX-512 tier is compiled with VNNI and requires it
  // (its int8 GEMM, qgemm_avx512.cc, issues vpdpbusd), not avx512_bf16: Cascade Lake, Ice Lake and
  // Tiger Lake take it.
  bool HasAvx2Tier() const { return avx2 && fma && f16c && bmi2; }
  bool HasAvx512Tier() const {
    return avx512f && avx512bw && avx512vl && avx512dq && avx512_vnni && HasAvx2Tier();
  }
  std::string ToString() const;
};

// Detected once. The environment variable LATHE_ISA=scalar|avx2|avx512 caps the tier used
// (for testing the slower paths on a fast machine).
const CpuFeatures& GetCpuFeatures();
// A fresh cpuid reading (GetCpuFeatures keeps its first one): for work whose result does not depend on the
// tier, so that doing it does not fix the process's tier (tests/emu builds a model natively, then runs it on an
// emulated CPU whose CPUID must decide).
CpuFeatures DetectCpuFeatures();

// True where the CPU executes 256-bit vector operations as two 128-bit halves: AMD Zen 1 / Zen+
// (family 17h, models below 30h) and Hygon Dhyana (family 18h). The AVX2 tier then takes the split
// (128-bit) form of its int8 kernels: the same arithmetic with half the multiplies, converts and
// FMAs per block (Q4 GEMV ~1.4x faster on Zen 1). LATHE_AVX2_SPLIT=0|1 overrides (A/B runs, tests).
// Detected once, apart from GetCpuFeatures.
bool Splits256BitOps();

enum class IsaTier { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
IsaTier BestIsaTier();  // highest tier the CPU has, capped by LATHE_ISA
const char* IsaTierName(IsaTier t);
// True where bf16 products run on vdpbf16ps: the AVX-512 tier is the best one (BestIsaTier) and the CPU
// has avx512_bf16, unless LATHE_BF16_DOT=0 (A/B runs). Then BF16 inference weights are packed in pair
// strips (kernels::StripWeight) and bf16 mixed-precision training's products take the pair arithmetic.
bool UsesBf16Dot();
// Where UsesBf16Dot(): whether the bf16 pair GEMM tiles run their chains on two f32 FMAs per pair instead of
// one vdpbf16ps (kernels/cpu/bf16_pairs.h, TileT: the same bits). Decided once by timing both instructions
// (a few ms, interleaved, best of 3): FMAs where vdpbf16ps does under 0.8x their flops (Intel's cores run it at
// half the FMA rate: 82 vs 166 GFLOP/s on an Emerald Rapids Xeon; Zen 4/5 at twice it). LATHE_BF16_PAIRS=fma
// or dp forces one (tests run both).
bool Bf16PairsOnFma();
// The *Default() of a tuning switch: this CPU's own choice, whatever the LATHE_* variable forces (the tests' forced
// runs skip themselves where they would repeat the unforced run: tests/test_util.cc).
bool Bf16PairsOnFmaDefault();
// Where UsesBf16Dot(): whether the training GEMM's bf16 products (kernels/cpu/bf16dot_amx.cc: the linears' forward,
// input and weight gradients, LoRA's fused products, the loss head's) run on AMX tiles (tdpbf16ps, 16 x 16 x 32
// per instruction) instead of the pair tiles: the CPU has amx_tile and amx_bf16 and Linux grants the process the
// tile state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once here). Their arithmetic is then AMX's, not the pair
// chain's: per element one tdpbf16ps per 16 pairs onto an f32 accumulator, close to the exact sum (measured:
// within a few f32 ulps of the exact dot, not the bits of any chain of f32 adds). LATHE_BF16_PAIRS=dp or fma turns
// it off; amx (or unset) keeps it where the CPU has it.
bool UsesAmxBf16();
bool UsesAmxBf16Default();
// A LATHE_* environment switch that forces a tuning choice: true for "1", false for "0", nullopt when unset or
// anything else (LATHE_AVX2_SPLIT, LATHE_INT16_PROMPT, LATHE_GEMM_SUBCHUNKS).
std::optional<bool> EnvSwitch(const char* name);

// One core's f32 FMA throughput in GFLOP/s (the peak that benchmarks' MFU and "% of peak" divide
// by), measured with 12 independent FMA chains in registers at the vector width of BestIsaTier():
// zmm on the AVX-512 tier, ymm on AVX2 (on CPUs with two 512-bit FMA pipes zmm is ~2x ymm). 0 on
// the scalar tier. Takes iters x 12 FMAs (30M: ~0.1-0.2 s).
double MeasureFmaPeakGflops(long long iters = 30'000'000);
// One core's bf16 dot-product throughput in GFLOP/s where UsesBf16Dot(), else 0: the peak bf16 rows' MFU
// divides by there. vdpbf16ps zmm, 12 chains (each instruction 64 flops), or where Bf16PairsOnFma the zmm FMA
// peak, which the pair tiles then run on.
double MeasureBf16DotPeakGflops(long long iters = 30'000'000);
// One core's AMX bf16 throughput in GFLOP/s where UsesAmxBf16(), else 0: 4 tile accumulators, 2 A and 2 B tiles
// in registers (tdpbf16ps: 16 x 16 x 32 multiply-adds each). iters x 4 instructions (1M: ~20 ms).
double MeasureAmxBf16PeakGflops(long long iters = 1'000'000);

}  // namespace lathe
