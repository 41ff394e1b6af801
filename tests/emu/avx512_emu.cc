// The AVX-512 tier's kernels, run on an emulated AVX-512 CPU (tests/emu/avx512_emu.py drives this
// process): on a machine without AVX-512 the op tests skip that tier, so this is where its code runs.
//
// Protocol: this process builds every case natively (inputs, references from the scalar definitions,
// output buffers filled with NaN), prints one JSON line {entry, fs_base, stack_top, cases: [{name,
// outs: [[addr, bytes], ...]}]} and blocks on stdin. The driver maps this process's memory (read
// from /proc/PID/mem) into the emulator, calls LatheEmuRunCase(i) there for each case (the only code
// that touches the AVX-512 tier), writes each case's output buffers back into this process and sends
// a line; this process then checks every case against its reference and exits 1 on any failure.
// With --native it runs the cases on this CPU instead (for an AVX-512 machine, or to check the
// harness itself with LATHE_EMU_TIER=avx2).
#include <asm/prctl.h>

#include <malloc.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/cpu.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "model/load_gguf.h"
#include "model/transformer.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/train_dispatch.h"
#include "kernels/quant.h"
#include "../ops/ops_test_util.h"

namespace lathe::kernels {
namespace {

using testing::FitK;
using testing::MakeWeight;
using testing::NormalizedError;
using testing::RandomVec;
using testing::TestWeight;

// The tier the emulated code runs (AVX-512 unless LATHE_EMU_TIER=avx2|scalar, which checks the
// harness against a tier this CPU has).
IsaTier g_tier = IsaTier::kAvx512;
bool g_native = false;

struct Out {
  std::vector<float> v;
  explicit Out(size_t n) : v(n, std::numeric_limits<float>::quiet_NaN()) {}
};

struct Case {
  std::string name;
  std::function<void()> run;            // the tier's computation (emulated); writes only into outs
  std::function<std::string()> check;   // native, afterwards: "" = pass, else what is wrong
  std::vector<std::shared_ptr<Out>> outs;
  bool warm_up = true;  // also run natively on the AVX2 tier first (not: cases whose tier is global)
};

std::vector<Case>& Cases() {
  static std::vector<Case> c;
  return c;
}

std::shared_ptr<Out> NewOut(Case& c, size_t n) {
  c.outs.push_back(std::make_shared<Out>(n));
  return c.outs.back();
}

std::string Fmt(const char* f, double a, double b) {
  char buf[160];
  std::snprintf(buf, sizeof buf, f, a, b);
  return buf;
}

std::string ErrAtMost(const std::vector<float>& y, const std::vector<float>& ref, double limit) {
  for (float v : y)
    if (std::isnan(v)) return "output not (fully) written";
  const double e = NormalizedError(y, ref);
  return e <= limit ? "" : Fmt("normalized error %.3g > %.3g", e, limit);
}

const cpu::KernelTable& Tier() { return cpu::KernelsFor(g_tier); }

const DType kWeightTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1};
// The llama.cpp block types the AVX-512 table computes with the AVX2 kernel (quant_ext_avx2.cc).
const DType kExtTypes[] = {DType::kQ5_0, DType::kQ5_1, DType::kQ2_K, DType::kQ3_K,
                           DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
// Weight types per case family: every type for the kernels, fewer for the (slower) MatMul paths.
std::vector<DType> WithExt(bool all_ext) {
  std::vector<DType> v(std::begin(kWeightTypes), std::end(kWeightTypes));
  if (all_ext) {
    for (DType t : kExtTypes) v.push_back(t);  // not a range insert: GCC 12's -Warray-bounds misfires on it
  } else {
    v.push_back(DType::kQ5_1);
    v.push_back(DType::kQ4_K);
  }
  return v;
}

// MatMulWith (one thread: the pool runs inline) on the GEMV, batched-GEMV and panel paths; block
// types also with exact activations (dequantize + f32 panel), and batched rows bit-identical to
// each row alone for every dtype (a decode row's logits must not depend on the batch).
void AddMatMulCases() {
  struct Shape {
    int64_t N, K;
  };
  const Shape block_shapes[] = {{5, 64}, {37, 96}, {13, 576}};
  const Shape float_shapes[] = {{3, 7}, {17, 100}, {11, 576}};
  uint32_t seed = 1;
  for (DType dt : WithExt(false)) {
    const bool block = IsQuantized(dt);
    for (Shape s : block ? std::vector<Shape>(std::begin(block_shapes), std::end(block_shapes))
                         : std::vector<Shape>(std::begin(float_shapes), std::end(float_shapes))) {
      s.K = FitK(dt, s.K);
      for (int64_t M : {1, 2, 3, 5, 17, 40}) {
        auto w = std::make_shared<TestWeight>(MakeWeight(dt, s.N, s.K, seed));
        auto x = std::make_shared<std::vector<float>>(RandomVec(M * s.K, seed + 1));
        ++seed;
        auto ref = std::make_shared<std::vector<float>>(M * s.N);
        ref::MatMul(x->data(), M, w->t, ref->data());
        Case c;
        c.name = std::string("MatMul ") + DTypeName(dt) + " M=" + std::to_string(M) + " N=" + std::to_string(s.N) +
                 " K=" + std::to_string(s.K);
        auto y = NewOut(c, M * s.N);
        std::shared_ptr<Out> y_exact, y_rows;
        if (block) y_exact = NewOut(c, M * s.N);
        if (M > 1) y_rows = NewOut(c, M * s.N);
        c.run = [=] {
          ThreadPool pool(1);
          cpu::MatMulWith(Tier().mm, pool, x->data(), M, w->t, y->v.data());
          if (y_exact) cpu::MatMulWith(Tier().mm, pool, x->data(), M, w->t, y_exact->v.data(), true);
          if (y_rows)
            for (int64_t i = 0; i < M; ++i)
              cpu::MatMulWith(Tier().mm, pool, x->data() + i * s.K, 1, w->t, y_rows->v.data() + i * s.N);
        };
        c.check = [=]() -> std::string {
          std::string e = ErrAtMost(y->v, *ref, testing::MatMulErrorLimit(dt, M, s.N));
          if (!e.empty()) return e;
          if (y_exact) {
            // Exact activations: f32 against exactly dequantized weights, summation order only.
            std::vector<float> wd(s.N * s.K);
            for (int64_t n = 0; n < s.N; ++n)
              ref::DequantizeRow(dt, w->bytes.data() + n * w->t.row_bytes(), s.K, wd.data() + n * s.K);
            e = ErrAtMost(y_exact->v, testing::DoubleMatMul(x->data(), M, wd.data(), s.N, s.K), 2e-6);
            if (!e.empty()) return "exact activations: " + e;
          }
          if (y_rows && y_rows->v != y->v) return "batched rows differ from the same rows one at a time";
          return "";
        };
        Cases().push_back(std::move(c));
      }
    }
  }
}

// Int16 prompt rows (MatMulInt16With) and a step's mixed int8 / int16 row runs (MatMulRowsWith): the AVX-512
// tier's vpdpbusd form has the bits of the AVX2 tier's vpmaddwd form (computed natively), for every int16 type,
// N with 16- / 8- / 4-row remainders and M past a tile.
void AddInt16Cases() {
  struct Shape {
    int64_t N, K;
  };
  uint32_t seed = 500;
  for (DType dt : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ4_K, DType::kQ5_K}) {
    for (Shape s : {Shape{37, 256}, Shape{20, 512}}) {
      for (int64_t M : {3, 9}) {
        auto w = std::make_shared<TestWeight>(MakeWeight(dt, s.N, s.K, seed));
        auto x = std::make_shared<std::vector<float>>(RandomVec(M * s.K, seed + 1));
        seed += 2;
        // Mixed runs: rows 0-1 int16, then int8 (not for the K-quants: their int8 rows take the K-quant GEMV).
        const bool mixed = !IsKQuant(dt);
        auto runs = std::make_shared<std::vector<RowRun>>(
            mixed ? std::vector<RowRun>{{2, true}, {M - 2, false}} : std::vector<RowRun>{{M, true}});
        Case c;
        c.name = std::string("int16 rows ") + DTypeName(dt) + " M=" + std::to_string(M) + " N=" + std::to_string(s.N) +
                 " K=" + std::to_string(s.K);
        auto y16 = NewOut(c, M * s.N), yr = NewOut(c, M * s.N), y8 = NewOut(c, M * s.N);
        c.run = [=] {
          ThreadPool pool(1);
          if (!cpu::Int16Takes(Tier().mm, w->t)) return;
          cpu::MatMulInt16With(Tier().mm, pool, x->data(), M, w->t, y16->v.data());
          cpu::MatMulRowsWith(Tier().mm, pool, x->data(), M, w->t, yr->v.data(), *runs);
          for (int64_t i = mixed ? 2 : M; i < M; ++i)  // the int8 rows alone (M = 1)
            cpu::MatMulWith(Tier().mm, pool, x->data() + i * s.K, 1, w->t, y8->v.data() + i * s.N);
        };
        c.check = [=]() -> std::string {
          ThreadPool pool(1);
          const cpu::MatMulKernels& a2 = cpu::KernelsFor(IsaTier::kAvx2).mm;
          std::vector<float> want16(M * s.N), wantr(M * s.N);
          cpu::MatMulInt16With(a2, pool, x->data(), M, w->t, want16.data());
          if (y16->v != want16) return "int16 rows differ from the AVX2 tier's";
          // The int16 rows of the mixed call: the int16 bits; its int8 rows: the tier's own int8 rows (M = 1).
          for (int64_t i = 0; i < M; ++i) {
            const std::vector<float>& want = !mixed || i < 2 ? want16 : y8->v;
            if (!std::equal(yr->v.begin() + i * s.N, yr->v.begin() + (i + 1) * s.N, want.begin() + i * s.N))
              return "mixed runs: row " + std::to_string(i) + " differs from its own call";
          }
          return "";
        };
        Cases().push_back(std::move(c));
      }
    }
  }
}

// The GEMV kernel for every x row count it takes (1..4), y with a row stride wider than N.
void AddGemvCases() {
  for (DType dt : WithExt(true)) {
    for (int64_t m = 1; m <= 4; ++m) {
      const int64_t N = 23, K = IsQuantized(dt) ? FitK(dt, 320) : 301, ldy = N + 2;
      auto w = std::make_shared<TestWeight>(MakeWeight(dt, N, K, 30 + (uint32_t)m));
      auto x = std::make_shared<std::vector<float>>(RandomVec(m * K, 40 + (uint32_t)m));
      auto ref = std::make_shared<std::vector<float>>(m * N);
      ref::MatMul(x->data(), m, w->t, ref->data());
      Case c;
      c.name = std::string("gemv kernel ") + DTypeName(dt) + " m=" + std::to_string(m);
      auto yk = NewOut(c, m * ldy);
      auto xq = NewOut(c, m * (K / 32) * sizeof(cpu::BlockQ8X) / sizeof(float) + 16);  // scratch
      c.run = [=] {
        const cpu::KernelTable& kt = Tier();
        const void* xa = x->data();
        if (IsQuantized(dt)) {
          cpu::BlockQ8X* q = (cpu::BlockQ8X*)xq->v.data();
          for (int64_t i = 0; i < m; ++i) kt.mm.quantize_x(x->data() + i * K, K, q + i * (K / 32));
          xa = q;
        }
        kt.mm.gemv(dt, w->bytes.data(), w->t.row_bytes(), N, xa, m, K, yk->v.data(), ldy);
      };
      c.check = [=]() -> std::string {
        std::vector<float> y(m * N);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t n = 0; n < N; ++n) y[i * N + n] = yk->v[i * ldy + n];
        return ErrAtMost(y, *ref, IsQuantized(dt) ? 1.2e-2 : 2e-6);
      };
      Cases().push_back(std::move(c));
    }
  }
}

// Row dequantization vs the reference: exact, but Q4_1 may round d*q + m once (FMA).
void AddDequantCases() {
  for (DType dt : WithExt(true)) {
    for (int64_t K0 : {32, 96, 320}) {
      if (IsKQuant(dt) && K0 == 96) continue;  // the same 256 as K0 = 32
      const int64_t N = 5, K = FitK(dt, K0);
      auto w = std::make_shared<TestWeight>(MakeWeight(dt, N, K, 5));
      Case c;
      c.name = std::string("dequant_rows ") + DTypeName(dt) + " K=" + std::to_string(K);
      auto out = NewOut(c, N * K);
      c.run = [=] { Tier().mm.dequant_rows(dt, w->bytes.data(), w->t.row_bytes(), N, K, out->v.data(), K); };
      c.check = [=]() -> std::string {
        std::vector<float> ref(N * K);
        for (int64_t n = 0; n < N; ++n)
          ref::DequantizeRow(dt, w->bytes.data() + n * w->t.row_bytes(), K, ref.data() + n * K);
        return ErrAtMost(out->v, ref, dt == DType::kQ4_1 ? 1e-7 : 0.0);
      };
      Cases().push_back(std::move(c));
    }
  }
}

// RmsNorm, SiluMul, Dot, Axpy, Softmax: summation order and the polynomial exp differ (2e-6).
void AddElementwiseCases() {
  for (int64_t n : {1, 5, 16, 17, 100, 1003}) {
    const std::string ns = " n=" + std::to_string(n);
    {
      const int64_t T = 3;
      auto x = std::make_shared<std::vector<float>>(RandomVec(T * n, 1, 3.0f));
      auto w = std::make_shared<std::vector<float>>(RandomVec(n, 2));
      Case c;
      c.name = "rms_norm" + ns;
      auto out = NewOut(c, T * n);
      c.run = [=] { Tier().rms_norm(x->data(), w->data(), out->v.data(), T, n, 1e-5f); };
      c.check = [=] {
        std::vector<float> ref(T * n);
        ref::RmsNorm(x->data(), w->data(), ref.data(), T, n, 1e-5f);
        return ErrAtMost(out->v, ref, 2e-6);
      };
      Cases().push_back(std::move(c));
    }
    {
      auto g = std::make_shared<std::vector<float>>(RandomVec(n, 3, 4.0f));
      if (n > 4) {
        (*g)[0] = 95.0f;   // exp(-g) underflows
        (*g)[1] = -95.0f;  // exp(-g) overflows: silu -> -0
        (*g)[2] = 0.0f;
      }
      auto up = std::make_shared<std::vector<float>>(RandomVec(n, 4));
      Case c;
      c.name = "silu_mul" + ns;
      auto out = NewOut(c, n);
      c.run = [=] {
        std::memcpy(out->v.data(), g->data(), n * sizeof(float));
        Tier().silu_mul(out->v.data(), up->data(), n);
      };
      c.check = [=] {
        std::vector<float> ref = *g;
        ref::SiluMul(ref.data(), up->data(), n);
        return ErrAtMost(out->v, ref, 2e-6);
      };
      Cases().push_back(std::move(c));
    }
    {
      auto a = std::make_shared<std::vector<float>>(RandomVec(n, 5));
      auto b = std::make_shared<std::vector<float>>(RandomVec(n, 6));
      Case c;
      c.name = "dot, axpy" + ns;
      auto d = NewOut(c, 1);
      auto y = NewOut(c, n);
      c.run = [=] {
        d->v[0] = Tier().dot(a->data(), b->data(), n);
        std::memcpy(y->v.data(), b->data(), n * sizeof(float));
        Tier().axpy(y->v.data(), 0.37f, a->data(), n);
      };
      c.check = [=]() -> std::string {
        double ref = 0, norm = 0;
        for (int64_t i = 0; i < n; ++i) {
          ref += (double)(*a)[i] * (*b)[i];
          norm += std::fabs((double)(*a)[i] * (*b)[i]);
        }
        if (!(std::fabs(d->v[0] - ref) <= 1e-6 * norm + 1e-30)) return Fmt("dot %.9g, want %.9g", d->v[0], ref);
        std::vector<float> yr(n);
        for (int64_t i = 0; i < n; ++i) yr[i] = (*b)[i] + 0.37f * (*a)[i];
        return ErrAtMost(y->v, yr, 1e-7);
      };
      Cases().push_back(std::move(c));
    }
    {
      auto x = std::make_shared<std::vector<float>>(RandomVec(n, 7, 5.0f));
      Case c;
      c.name = "softmax" + ns;
      auto out = NewOut(c, n);
      c.run = [=] {
        std::memcpy(out->v.data(), x->data(), n * sizeof(float));
        Tier().softmax(out->v.data(), n);
      };
      c.check = [=] {
        std::vector<float> ref = *x;
        ref::Softmax(ref.data(), n);
        return ErrAtMost(out->v, ref, 2e-6);
      };
      Cases().push_back(std::move(c));
    }
  }
}

// Attention with the tier's table (grouped kernels for head sizes that are multiples of 8, the
// per-position Dot / Softmax / Axpy for the rest) vs the scalar table.
void AddAttentionCases() {
  struct A {
    int64_t T, pos0;
    int n_head, n_kv_head, head_dim;
  };
  const A cases[] = {{1, 9, 4, 2, 64}, {7, 3, 6, 2, 20}, {5, 0, 3, 3, 8}, {3, 30, 9, 3, 32}};
  uint32_t seed = 100;
  for (const A& a : cases) {
    const int64_t S = a.pos0 + a.T;
    const int64_t qs = a.n_head * a.head_dim + 3, kvs = a.n_kv_head * a.head_dim + 5, os = a.n_head * a.head_dim + 1;
    auto q = std::make_shared<std::vector<float>>(RandomVec(a.T * qs, seed++));
    auto k = std::make_shared<std::vector<float>>(RandomVec(S * kvs, seed++));
    auto v = std::make_shared<std::vector<float>>(RandomVec(S * kvs, seed++));
    const float scale = 1.0f / std::sqrt((float)a.head_dim);
    auto ref = std::make_shared<std::vector<float>>(a.T * os, 0.0f);
    {
      ThreadPool pool(1);
      cpu::AttentionWith(cpu::KernelsFor(IsaTier::kScalar), pool, q->data(), qs, k->data(), v->data(), kvs, a.T,
                         a.pos0, a.n_head, a.n_kv_head, a.head_dim, scale, ref->data(), os);
    }
    Case c;
    c.name = "attention T=" + std::to_string(a.T) + " pos0=" + std::to_string(a.pos0) +
             " head_dim=" + std::to_string(a.head_dim);
    auto out = NewOut(c, a.T * os);
    c.run = [=] {
      std::memset(out->v.data(), 0, out->v.size() * sizeof(float));  // the stride's spare column
      ThreadPool pool(1);
      cpu::AttentionWith(Tier(), pool, q->data(), qs, k->data(), v->data(), kvs, a.T, a.pos0, a.n_head,
                         a.n_kv_head, a.head_dim, scale, out->v.data(), os);
    };
    c.check = [=] { return ErrAtMost(out->v, *ref, 2e-6); };
    Cases().push_back(std::move(c));
  }
}

// A run of prompt tokens over paged K/V (GroupAttentionRows: the AVX-512 zmm kernel for head sizes
// 32..128), bit for bit the AVX2 table's (which equals decode's GroupAttention per token): from
// position 0 and mid-context, across the 64-position blocks, 4-row batches with a partial last one.
void AddAttentionRowsCases() {
  struct A {
    int64_t n_pos0, n_tok;
    int group, head_dim;
  };
  const A cases[] = {{0, 9, 3, 64}, {61, 6, 2, 128}, {5, 3, 3, 32}};
  uint32_t seed = 120;
  for (const A& a : cases) {
    const int64_t n_pos = a.n_pos0 + a.n_tok, hd = a.head_dim;
    auto off = std::make_shared<std::vector<int64_t>>(n_pos);
    for (int64_t p = 0; p < n_pos; ++p) (*off)[p] = (n_pos - 1 - p) * hd;  // rows in reverse: a real gather
    auto k = std::make_shared<std::vector<float>>(RandomVec(n_pos * hd, seed++));
    auto v = std::make_shared<std::vector<float>>(RandomVec(n_pos * hd, seed++));
    const int64_t qs = a.group * hd + 3;
    auto q = std::make_shared<std::vector<float>>(RandomVec(a.n_tok * qs, seed++, 2.0f));
    const float scale = 1.0f / std::sqrt((float)hd);
    Case c;
    c.name = "attention rows n_pos0=" + std::to_string(a.n_pos0) + " n_tok=" + std::to_string(a.n_tok) +
             " head_dim=" + std::to_string(hd);
    auto out = NewOut(c, a.n_tok * qs);
    auto scores = NewOut(c, a.n_tok * a.group * n_pos);
    auto run = [=](const cpu::KernelTable& kt, float* o, float* sc) {
      std::memset(o, 0, sizeof(float) * a.n_tok * qs);
      cpu::GroupAttentionRowsWith(kt, q->data(), qs, a.n_tok, a.group, k->data(), v->data(), off->data(), a.n_pos0,
                                  (int)hd, scale, o, qs, sc, 0);
    };
    c.run = [=] { run(Tier(), out->v.data(), scores->v.data()); };
    c.check = [=]() -> std::string {
      std::vector<float> o2(a.n_tok * qs), sc2(a.n_tok * a.group * n_pos);
      run(cpu::KernelsFor(IsaTier::kAvx2), o2.data(), sc2.data());
      return out->v == o2 ? "" : "differs from the AVX2 table";
    };
    Cases().push_back(std::move(c));
  }
}

// Packed NF4/FP4 (+ double quant) and LLM.int8 weights: the decode kernels (M < 4) and the
// dequantized panels, vs a double-precision product with the reference dequantization.
void AddPackedCases() {
  const DType packed[] = {DType::kNF4, DType::kFP4, DType::kNF4DQ, DType::kFP4DQ, DType::kI8Row};
  uint32_t seed = 1;
  for (DType t : packed) {
    for (int64_t N : {5, 37}) {
      const int64_t K = N == 5 ? 128 : 192;
      for (int64_t M : {1, 3, 8}) {
        std::vector<float> f = RandomVec(N * K, seed++, 0.05f);
        Tensor src{f.data(), DType::kF32, {N, K}};
        auto pw = QuantizeWeight(src, t, "emu");
        LATHE_CHECK(pw.ok());
        auto w = std::make_shared<PackedWeight>(std::move(*pw));
        auto x = std::make_shared<std::vector<float>>(RandomVec(M * K, seed++));
        Case c;
        c.name = std::string("packed ") + DTypeName(t) + " M=" + std::to_string(M) + " N=" + std::to_string(N);
        auto y = NewOut(c, M * N);
        c.run = [=] {
          ThreadPool pool(1);
          quant::PackedMatMul(quant::QuantKernelsFor(g_tier), Tier().mm, pool, x->data(), M, w->view(), y->v.data());
        };
        c.check = [=] {
          std::vector<float> wd(N * K);
          DequantizePacked(w->view(), wd.data());
          return ErrAtMost(y->v, testing::DoubleMatMul(x->data(), M, wd.data(), N, K),
                           testing::PackedMatMulErrorLimit(t, M, N));
        };
        Cases().push_back(std::move(c));
      }
    }
  }
}

// The training GEMM with the tier's train table (AVX-512: two-strip micro-kernels) equals the AVX2
// table's bit for bit (the same FMAs per element): forward, input and weight gradients, odd shapes.
void AddTrainGemmCases() {
  struct Shape {
    int64_t M, N, K;
  };
  // {13, 70, 33} and {19, 100, 50} run the AVX-512 panel tile (8 x 48 over packed A) in every product
  // at least 48 wide, with partial rows and strips.
  const Shape shapes[] = {{5, 7, 19}, {13, 70, 33}, {20, 53, 2}, {9, 3, 40}, {19, 100, 50}};
  uint32_t seed = 90;
  for (const Shape s : shapes) {
    auto w = std::make_shared<TestWeight>(MakeWeight(DType::kF32, s.N, s.K, seed++));
    auto x = std::make_shared<std::vector<float>>(RandomVec(s.M * s.K, seed++));
    auto dy = std::make_shared<std::vector<float>>(RandomVec(s.M * s.N, seed++));
    auto dw0 = std::make_shared<std::vector<float>>(RandomVec(s.N * s.K, seed++));
    Case c;
    c.name = "train gemm M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K);
    auto y = NewOut(c, s.M * s.N), dx = NewOut(c, s.M * s.K), dw = NewOut(c, s.N * s.K);
    auto run = [=](IsaTier tier, float* yo, float* dxo, float* dwo) {
      ThreadPool pool(1);
      const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(tier);
      const cpu::KernelTable& kt = cpu::KernelsFor(IsaTier::kAvx2);
      cpu::MatMulForwardWith(tk, kt, pool, yo, x->data(), s.M, w->t);
      cpu::MatMulBackwardInputWith(tk, kt, pool, dxo, dy->data(), s.M, w->t, false);
      std::copy(dw0->begin(), dw0->end(), dwo);
      cpu::MatMulBackwardWeightWith(tk, pool, dwo, dy->data(), x->data(), s.M, s.N, s.K);
    };
    c.run = [=] { run(g_tier, y->v.data(), dx->v.data(), dw->v.data()); };
    c.check = [=]() -> std::string {
      std::vector<float> y2(s.M * s.N), dx2(s.M * s.K), dw2(s.N * s.K);
      run(IsaTier::kAvx2, y2.data(), dx2.data(), dw2.data());
      if (y->v != y2) return "forward differs from the AVX2 train table";
      if (dx->v != dx2) return "input gradient differs from the AVX2 train table";
      if (dw->v != dw2) return "weight gradient differs from the AVX2 train table";
      return "";
    };
    Cases().push_back(std::move(c));
  }
}

// stories260K through the whole inference path with the process's best tier (the emulated CPU's
// CPUID decides it, so the model runs on AVX-512 there): greedy tokens from BOS and per-prompt equal to
// the float64 reference in ../shared/models/stories260K/reference, top-5 logits of one prefill within
// 1e-4 (as tests/golden/stories260k_test.cc). Loading happens natively (files); Forward emulated.
void AddModelCase(const std::string& shared) {
  const std::string path = shared + "/models/stories260K/stories260K.gguf";
  std::ifstream in(shared + "/models/stories260K/reference/stories260K_reference.json");
  auto g = formats::GgufFile::Open(path);
  if (!in || !g.ok()) {
    std::fprintf(stderr, "avx512_emu: %s or its reference not found: no model case\n", path.c_str());
    return;
  }
  auto w = model::LoadGgufWeights(std::shared_ptr<formats::GgufFile>(std::move(*g)));
  LATHE_CHECK_MSG(w.ok(), "%s", w.status().message().c_str());
  auto weights = std::make_shared<model::ModelWeights>(std::move(*w));
  auto pool = std::make_shared<ThreadPool>(1);
  auto tf = std::make_shared<model::Transformer>(*weights, *pool);
  const nlohmann::json ref = nlohmann::json::parse(in);
  struct Greedy {
    std::vector<int32_t> prompt, want;
  };
  auto runs = std::make_shared<std::vector<Greedy>>();
  runs->push_back({{1}, ref["greedy_from_bos"]["tokens"].get<std::vector<int32_t>>()});
  for (const auto& p : ref["greedy_prompts"])
    runs->push_back({p["prompt_ids_with_bos"].get<std::vector<int32_t>>(), p["tokens"].get<std::vector<int32_t>>()});
  auto ids = std::make_shared<std::vector<int32_t>>(ref["logits_check"]["input_ids"].get<std::vector<int32_t>>());
  auto per_pos = std::make_shared<nlohmann::json>(ref["logits_check"]["per_position"]);
  const int64_t V = tf->config().vocab_size;
  size_t n_tokens = 0;
  for (const Greedy& r : *runs) n_tokens += r.want.size();

  Case c;
  c.name = "stories260K forward (greedy tokens and logits vs the float64 reference)";
  auto tokens = NewOut(c, n_tokens);             // greedy tokens, as floats
  auto logits = NewOut(c, ids->size() * V);      // the prefill's logits, all positions
  auto tier = NewOut(c, 1);                      // the tier Forward ran with
  // The KV caches are made here, natively: their store is mapped memory (mmap), a system call the
  // emulated CPU cannot make.
  auto caches = std::make_shared<std::vector<std::unique_ptr<model::KvCache>>>();
  for (const Greedy& r : *runs) caches->push_back(std::make_unique<model::KvCache>(tf->config(), 1, (int64_t)r.want.size()));
  caches->push_back(std::make_unique<model::KvCache>(tf->config(), 1, 64));
  c.run = [=] {
    (void)weights, (void)pool;  // held here: tf refers to both
    std::vector<float> lg;
    size_t o = 0;
    size_t ci = 0;
    for (const Greedy& r : *runs) {
      model::KvCache& cache = *(*caches)[ci++];
      cache.Clear(0);  // the case may run more than once
      std::vector<int32_t> seq = r.prompt;
      model::SeqInput in0{0, std::span<const int32_t>(seq), false};
      if (!tf->Forward(cache, std::span<const model::SeqInput>(&in0, 1), &lg).ok()) return;
      while (seq.size() < r.want.size()) {
        seq.push_back((int32_t)(std::max_element(lg.begin(), lg.begin() + V) - lg.begin()));
        if (seq.size() == r.want.size()) break;
        model::SeqInput step{0, std::span<const int32_t>(&seq.back(), 1), false};
        if (!tf->Forward(cache, std::span<const model::SeqInput>(&step, 1), &lg).ok()) return;
      }
      for (int32_t t : seq) tokens->v[o++] = (float)t;
    }
    model::KvCache& cache = *(*caches)[ci];
    cache.Clear(0);
    model::SeqInput all{0, std::span<const int32_t>(*ids), true};
    if (!tf->Forward(cache, std::span<const model::SeqInput>(&all, 1), &lg).ok()) return;
    std::memcpy(logits->v.data(), lg.data(), logits->v.size() * sizeof(float));
    tier->v[0] = (float)(int)cpu::Best().tier;
  };
  c.check = [=]() -> std::string {
    if (std::isnan(tier->v[0])) return "did not finish";
    if (!g_native && (int)tier->v[0] != (int)g_tier)
      return std::string("ran on the ") + IsaTierName((IsaTier)(int)tier->v[0]) + " tier";
    size_t o = 0;
    for (size_t i = 0; i < runs->size(); ++i)
      for (int32_t t : (*runs)[i].want)
        if ((int32_t)tokens->v[o++] != t) return "greedy run " + std::to_string(i) + " differs from the reference";
    for (const auto& pp : *per_pos) {
      const float* row = &logits->v[(int64_t)pp["pos"] * V];
      std::vector<int> order(V);
      for (int k = 0; k < V; ++k) order[k] = k;
      std::partial_sort(order.begin(), order.begin() + 5, order.end(), [&](int a, int b) { return row[a] > row[b]; });
      for (int k = 0; k < 5; ++k) {
        if (order[k] != pp["top5_ids"][k].get<int>()) return "top-5 order at pos " + pp["pos"].dump();
        if (std::fabs(row[order[k]] - pp["top5_logits"][k].get<double>()) > 1e-4)
          return Fmt("logit %.6f vs %.6f", row[order[k]], pp["top5_logits"][k].get<double>());
      }
    }
    return "";
  };
  c.warm_up = false;  // its first Forward must pick the tier on the emulated CPU
  Cases().push_back(std::move(c));
}

}  // namespace
}  // namespace lathe::kernels

// Called by the emulator (and by --native): runs case i with the tier under test.
extern "C" __attribute__((noinline, used)) void LatheEmuRunCase(int64_t i) { lathe::kernels::Cases()[i].run(); }

int main(int argc, char** argv) {
  using namespace lathe::kernels;
  const bool native = argc > 1 && std::strcmp(argv[1], "--native") == 0;
  g_native = native;
  if (const char* t = std::getenv("LATHE_EMU_TIER")) {
    const std::string s = t;
    if (s == "avx2") g_tier = lathe::IsaTier::kAvx2;
    else if (s == "scalar") g_tier = lathe::IsaTier::kScalar;
    else if (s != "avx512") {
      std::fprintf(stderr, "LATHE_EMU_TIER=%s: expected avx512, avx2 or scalar\n", t);
      return 2;
    }
  }
  // Allocations in the emulated code must not need the kernel (no system calls there): no mmap'ed
  // chunks, and a heap grown once here and kept.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  void* volatile grow = malloc(64 << 20);  // volatile: the compiler may not drop the pair
  free(grow);
  const char* shared = std::getenv("LATHE_SHARED");
  if (shared) AddModelCase(shared);
  AddMatMulCases();
  AddGemvCases();
  AddInt16Cases();
  AddDequantCases();
  AddElementwiseCases();
  AddAttentionCases();
  AddAttentionRowsCases();
  AddPackedCases();
  AddTrainGemmCases();
  std::vector<Case>& cases = Cases();

  if (native) {
    if (!lathe::kernels::testing::CpuHasTier(g_tier)) {
      std::fprintf(stderr, "this CPU lacks the %s tier: run it under tests/emu/avx512_emu.py\n",
                   lathe::IsaTierName(g_tier));
      return 2;
    }
    for (size_t i = 0; i < cases.size(); ++i) LatheEmuRunCase((int64_t)i);
  } else {
    // First the same cases natively with the AVX2 tier where this CPU has it: checks the harness,
    // and grows the drivers' per-thread scratch buffers here, so the emulated run needs no new memory
    // from the kernel (a system call is not emulated).
    // (__builtin_cpu_supports, not GetCpuFeatures: that caches this CPU's features, and the model case
    // must detect the emulated CPU's.)
    __builtin_cpu_init();
    if (g_tier == lathe::IsaTier::kAvx512 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      g_tier = lathe::IsaTier::kAvx2;
      for (size_t i = 0; i < cases.size(); ++i)
        if (cases[i].warm_up) LatheEmuRunCase((int64_t)i);
      int fails = 0;
      for (Case& c : cases) {
        if (!c.warm_up) continue;
        const std::string e = c.check();
        if (!e.empty()) {
          ++fails;
          std::fprintf(stderr, "FAIL (avx2, native) %s: %s\n", c.name.c_str(), e.c_str());
        }
        for (auto& o : c.outs) std::fill(o->v.begin(), o->v.end(), std::numeric_limits<float>::quiet_NaN());
      }
      if (fails) {
        std::fprintf(stderr, "avx512_emu: %d cases fail natively on the avx2 tier: the harness is wrong\n", fails);
        return 1;
      }
      g_tier = lathe::IsaTier::kAvx512;
    }
    // The emulator runs on its own stack (this one is in use by the blocked read below).
    static std::vector<uint8_t> emu_stack(4 << 20);
    uint64_t fs_base = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_FS, &fs_base) != 0) {
      std::perror("arch_prctl(ARCH_GET_FS)");
      return 2;
    }
    std::string js = "{\"entry\": " + std::to_string((uintptr_t)&LatheEmuRunCase) +
                     ", \"fs_base\": " + std::to_string(fs_base) +
                     ", \"stack_top\": " + std::to_string((uintptr_t)(emu_stack.data() + emu_stack.size())) +
                     ", \"tier\": \"" + lathe::IsaTierName(g_tier) + "\", \"cases\": [";
    for (size_t i = 0; i < cases.size(); ++i) {
      js += std::string(i ? ", " : "") + "{\"name\": \"" + cases[i].name + "\", \"outs\": [";
      for (size_t j = 0; j < cases[i].outs.size(); ++j) {
        const auto& v = cases[i].outs[j]->v;
        js += std::string(j ? ", " : "") + "[" + std::to_string((uintptr_t)v.data()) + ", " +
              std::to_string(v.size() * sizeof(float)) + "]";
      }
      js += "]}";
    }
    js += "]}\n";
    std::fwrite(js.data(), 1, js.size(), stdout);
    std::fflush(stdout);
    std::string line;
    if (!std::getline(std::cin, line) || line != "checked") {
      std::fprintf(stderr, "avx512_emu: the driver did not finish (got '%s')\n", line.c_str());
      return 2;
    }
  }
  int fails = 0;
  for (Case& c : cases) {
    const std::string e = c.check();
    if (!e.empty()) {
      ++fails;
      std::printf("FAIL %s: %s\n", c.name.c_str(), e.c_str());
    }
  }
  std::printf("%s tier: %d passed, %d failed\n", lathe::IsaTierName(g_tier), (int)cases.size() - fails, fails);
  return fails ? 1 : 0;
}
