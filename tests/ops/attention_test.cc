// Attention (causal, grouped-query, strided rows) on every ISA tier against a double-precision
// scalar definition in this file, for decode (T = 1) and prefill chunks; threads agree bitwise.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/kernels.h"
#include "ops_test_util.h"

namespace lathe::kernels {
namespace {

using testing::AllTiers;
using testing::NormalizedError;
using testing::RandomVec;

struct Case {
  int64_t T, pos0;
  int n_head, n_kv_head, head_dim;
};
const Case kCases[] = {
    {1, 0, 2, 1, 8}, {1, 37, 9, 3, 64}, {5, 0, 4, 4, 20}, {17, 3, 9, 3, 64}, {3, 100, 14, 2, 13}};

// The definition, in double.
void RefAttention(const float* q, int64_t qs, const float* k, const float* v, int64_t kvs, const Case& c,
                  float scale, float* out, int64_t os) {
  const int group = c.n_head / c.n_kv_head;
  for (int64_t t = 0; t < c.T; ++t)
    for (int h = 0; h < c.n_head; ++h) {
      const int g = h / group;
      const int64_t n = c.pos0 + t + 1;
      std::vector<double> s(n);
      double mx = -1e300;
      for (int64_t j = 0; j < n; ++j) {
        double d = 0;
        for (int i = 0; i < c.head_dim; ++i)
          d += (double)q[t * qs + h * c.head_dim + i] * k[j * kvs + g * c.head_dim + i];
        s[j] = d * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (auto& x : s) sum += (x = std::exp(x - mx));
      for (int i = 0; i < c.head_dim; ++i) {
        double o = 0;
        for (int64_t j = 0; j < n; ++j) o += s[j] / sum * v[j * kvs + g * c.head_dim + i];
        out[t * os + h * c.head_dim + i] = (float)o;
      }
    }
}

class AttentionTier : public ::testing::TestWithParam<IsaTier> {};

TEST_P(AttentionTier, MatchesDefinition) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  uint32_t seed = 1;
  for (const Case& c : kCases) {
    const int64_t S = c.pos0 + c.T;
    // Strides wider than the data, as with fused QKV rows or a cache with spare columns.
    const int64_t qs = c.n_head * c.head_dim + 3, kvs = c.n_kv_head * c.head_dim + 5,
                  os = c.n_head * c.head_dim + 1;
    const std::vector<float> q = RandomVec(c.T * qs, seed++, 1.0f), k = RandomVec(S * kvs, seed++, 1.0f),
                             v = RandomVec(S * kvs, seed++, 1.0f);
    const float scale = 1.0f / std::sqrt((float)c.head_dim);
    std::vector<float> ref(c.T * os, 0.0f), out1(c.T * os, 0.0f);
    RefAttention(q.data(), qs, k.data(), v.data(), kvs, c, scale, ref.data(), os);
    ThreadPool pool1(1);
    cpu::AttentionWith(kt, pool1, q.data(), qs, k.data(), v.data(), kvs, c.T, c.pos0, c.n_head, c.n_kv_head,
                       c.head_dim, scale, out1.data(), os);
    EXPECT_LE(NormalizedError(out1, ref), 2e-6) << "T=" << c.T << " pos0=" << c.pos0 << " heads=" << c.n_head;
    for (int threads : {2, 3}) {
      ThreadPool pool(threads);
      std::vector<float> outt(c.T * os, 0.0f);
      cpu::AttentionWith(kt, pool, q.data(), qs, k.data(), v.data(), kvs, c.T, c.pos0, c.n_head, c.n_kv_head,
                         c.head_dim, scale, outt.data(), os);
      ASSERT_EQ(outt, out1) << threads << " threads";
    }
  }
}

// One token over a paged cache (GroupAttention): K/V rows scattered over blocks of a pool in a
// shuffled block table, several lengths (block tails, 1 position, several blocks), GQA groups of
// 1-4 heads and the head sizes the AVX2 tier specializes (32, 64, 128) plus ones it does not (8, 20).
TEST_P(AttentionTier, GroupAttentionPagedMatchesDefinition) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  uint32_t seed = 300;
  struct PCase {
    int64_t n_pos, block_size;
    int group, n_kv_head, head_dim;
  };
  const PCase cases[] = {{1, 16, 3, 3, 64},   {15, 16, 3, 3, 64}, {16, 16, 1, 2, 64}, {17, 16, 3, 3, 64},
                         {161, 16, 3, 3, 64}, {70, 8, 4, 2, 32},  {33, 4, 2, 1, 128}, {9, 16, 2, 2, 8},
                         {40, 16, 1, 3, 20},  {600, 16, 3, 3, 64}, {23, 16, 2, 1, 24}, {70, 16, 3, 2, 48},
                         {37, 16, 2, 2, 16},  {19, 8, 1, 1, 80},   {45, 16, 2, 1, 96}, {150, 16, 2, 4, 8},
                         {131, 8, 2, 1, 16},  {67, 16, 1, 2, 8}};
  for (const PCase& pc : cases) {
    const int64_t n_blocks_used = (pc.n_pos + pc.block_size - 1) / pc.block_size;
    const int64_t pool_blocks = n_blocks_used * 2 + 3, kv_dim = pc.n_kv_head * pc.head_dim;
    // A block table that skips and reverses pool blocks.
    std::vector<int32_t> table(n_blocks_used);
    for (int64_t b = 0; b < n_blocks_used; ++b) table[b] = (int32_t)(pool_blocks - 1 - 2 * b);
    const std::vector<float> k = RandomVec(pool_blocks * pc.block_size * kv_dim, seed++, 1.0f),
                             v = RandomVec(pool_blocks * pc.block_size * kv_dim, seed++, 1.0f);
    const int64_t n_head = (int64_t)pc.group * pc.n_kv_head;
    const std::vector<float> q = RandomVec(n_head * pc.head_dim, seed++, 2.0f);
    const float scale = 1.0f / std::sqrt((float)pc.head_dim);
    std::vector<int64_t> off(pc.n_pos);
    for (int64_t p = 0; p < pc.n_pos; ++p)
      off[p] = ((int64_t)table[p / pc.block_size] * pc.block_size + p % pc.block_size) * kv_dim;
    // The definition on the same rows gathered into a contiguous cache.
    std::vector<float> kc(pc.n_pos * kv_dim), vc(pc.n_pos * kv_dim);
    for (int64_t p = 0; p < pc.n_pos; ++p)
      for (int64_t i = 0; i < kv_dim; ++i) {
        kc[p * kv_dim + i] = k[off[p] + i];
        vc[p * kv_dim + i] = v[off[p] + i];
      }
    const Case c{1, pc.n_pos - 1, (int)n_head, pc.n_kv_head, pc.head_dim};
    std::vector<float> ref(n_head * pc.head_dim), out(n_head * pc.head_dim, -7.0f), sc(pc.n_pos);
    RefAttention(q.data(), n_head * pc.head_dim, kc.data(), vc.data(), kv_dim, c, scale, ref.data(),
                 n_head * pc.head_dim);
    for (int g = 0; g < pc.n_kv_head; ++g) {
      const int64_t h0 = (int64_t)g * pc.group;
      cpu::GroupAttentionWith(kt, q.data() + h0 * pc.head_dim, pc.group, k.data() + g * pc.head_dim,
                              v.data() + g * pc.head_dim, off.data(), pc.n_pos, pc.head_dim, scale,
                              out.data() + h0 * pc.head_dim, sc.data());
    }
    EXPECT_LE(NormalizedError(out, ref), 2e-6)
        << IsaTierName(GetParam()) << " n_pos=" << pc.n_pos << " group=" << pc.group << " hd=" << pc.head_dim;
  }
}

// A run of n_tok tokens after n_pos0 cached positions, `group` query heads per KV head, optional window.
struct RunCase {
  int64_t n_pos0, n_tok;
  int group, head_dim;
  int64_t window = 0;
};

// Element offsets of n_pos positions in a pool of 16-position blocks taken back to front, every other
// one (a scattered block table); the pool's size in blocks in *pool_blocks.
std::vector<int64_t> ScatteredOffsets(int64_t n_pos, int64_t block_size, int64_t kv_dim, int64_t* pool_blocks) {
  const int64_t n_blocks_used = (n_pos + block_size - 1) / block_size;
  *pool_blocks = n_blocks_used * 2 + 1;
  std::vector<int64_t> off(n_pos);
  for (int64_t p = 0; p < n_pos; ++p)
    off[p] = ((*pool_blocks - 1 - 2 * (p / block_size)) * block_size + p % block_size) * kv_dim;
  return off;
}

// A run of tokens (GroupAttentionRows): every token bit-identical to GroupAttention with its own
// n_pos (same tier), over runs that start at 0 and mid-context, cross the 64-position blocks of
// the AVX2 kernel, and head sizes it specializes (8, 24, 32, 48, 64, 128: odd and even chunk counts)
// and one it does not (20). With a sliding window each token equals GroupAttention over its last
// `window` positions: windows that start inside the run, before it, after it, of 1 and wider than
// the context.
TEST_P(AttentionTier, GroupAttentionRowsMatchesPerToken) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  uint32_t seed = 900;
  const RunCase cases[] = {{0, 1, 3, 64},   {0, 16, 3, 64},  {5, 16, 3, 64}, {63, 2, 3, 64}, {100, 70, 1, 64},
                         {0, 130, 2, 32}, {61, 9, 4, 128}, {0, 12, 2, 8},  {7, 5, 3, 20}, {60, 9, 3, 24},
                         {0, 70, 2, 48},  {66, 3, 1, 8},  {0, 141, 2, 8}, {60, 70, 2, 16}, {127, 6, 2, 8},
                         {0, 16, 3, 64, 5}, {5, 16, 3, 64, 12}, {100, 70, 1, 64, 64}, {0, 141, 2, 8, 100},
                         {60, 70, 2, 16, 200}, {127, 6, 2, 8, 1}, {7, 5, 3, 20, 9}, {0, 130, 2, 32, 129}};
  const int64_t block_size = 16, n_kv_head = 2;
  for (const RunCase& rc : cases) {
    const int64_t n_pos = rc.n_pos0 + rc.n_tok, kv_dim = n_kv_head * rc.head_dim;
    int64_t pool_blocks;
    const std::vector<int64_t> off = ScatteredOffsets(n_pos, block_size, kv_dim, &pool_blocks);
    const std::vector<float> k = RandomVec(pool_blocks * block_size * kv_dim, seed++, 1.0f),
                             v = RandomVec(pool_blocks * block_size * kv_dim, seed++, 1.0f);
    const int64_t q_stride = n_kv_head * rc.group * rc.head_dim + 8;  // rows with padding
    const std::vector<float> q = RandomVec(rc.n_tok * q_stride, seed++, 2.0f);
    const float scale = 1.0f / std::sqrt((float)rc.head_dim);
    const int64_t g = 1, h0 = g * rc.group;  // the second KV head
    std::vector<float> want(rc.n_tok * q_stride, 0.0f), got(rc.n_tok * q_stride, 0.0f), sc(n_pos);
    for (int64_t t = 0; t < rc.n_tok; ++t) {
      const int64_t end = rc.n_pos0 + t + 1, lo = rc.window > 0 ? std::max<int64_t>(0, end - rc.window) : 0;
      cpu::GroupAttentionWith(kt, q.data() + t * q_stride + h0 * rc.head_dim, rc.group, k.data() + g * rc.head_dim,
                              v.data() + g * rc.head_dim, off.data() + lo, end - lo, rc.head_dim, scale,
                              want.data() + t * q_stride + h0 * rc.head_dim, sc.data());
    }
    std::vector<float> scores(rc.n_tok * rc.group * n_pos);
    cpu::GroupAttentionRowsWith(kt, q.data() + h0 * rc.head_dim, q_stride, rc.n_tok, rc.group,
                                k.data() + g * rc.head_dim, v.data() + g * rc.head_dim, off.data(), rc.n_pos0,
                                rc.head_dim, scale, got.data() + h0 * rc.head_dim, q_stride, scores.data(), rc.window);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << IsaTierName(GetParam()) << " n_pos0=" << rc.n_pos0 << " n_tok=" << rc.n_tok
                                 << " hd=" << rc.head_dim << " window=" << rc.window << " at " << i;
    }
  }
}

// Whether a tier's table runs a bf16 KV cache on vdpbf16ps (attention_avx512bf16.cc).
bool Bf16KvOnDot(const cpu::KernelTable& kt) {
  return kt.group_attend_rows == cpu::avx512bf16::GroupAttendRows && !Bf16PairsOnFma();
}

// A KV cache of f16 / bf16 elements: each tier's kernels widen them exactly and run the f32 arithmetic,
// so one token (GroupAttention) and a run of tokens (GroupAttentionRows, windows too) give the very bits
// of the f32 call on the widened values: head sizes with zmm kernels (32, 64, 128), AVX2-only ones (8,
// 24, 48) and the generic form's (20); runs across the 64-position blocks; large values (f16's range
// is the caller's: the model's cache saturates them).
TEST_P(AttentionTier, SixteenBitKvEqualsF32OnTheWidenedValues) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  uint32_t seed = 1700;
  const RunCase cases[] = {{0, 1, 3, 64},    {37, 1, 3, 64},  {0, 70, 3, 64},  {100, 9, 2, 128}, {5, 16, 4, 32},
                         {60, 9, 3, 24},   {0, 70, 2, 48},  {66, 3, 1, 8},   {7, 5, 3, 20},    {0, 141, 2, 8},
                         {5, 16, 3, 64, 12}, {100, 70, 1, 64, 64}, {0, 130, 2, 32, 129}};
  const int64_t block_size = 16, n_kv_head = 2;
  for (DType kvt : {DType::kF16, DType::kBF16}) {
    if (kvt == DType::kBF16 && Bf16KvOnDot(kt)) continue;  // its own arithmetic: Bf16KvOnVdpbf16ps below
    for (const RunCase& kc : cases) {
      const int64_t n_pos = kc.n_pos0 + kc.n_tok, kv_dim = n_kv_head * kc.head_dim;
      int64_t pool_blocks;
      const std::vector<int64_t> off = ScatteredOffsets(n_pos, block_size, kv_dim, &pool_blocks);
      const size_t n = (size_t)(pool_blocks * block_size * kv_dim);
      std::vector<float> k = RandomVec(n, seed++, 3.0f), v = RandomVec(n, seed++, 3.0f);
      // The 16-bit cache and its exact widening.
      std::vector<uint16_t> k16(n), v16(n);
      std::vector<float> kw(n), vw(n);
      for (size_t i = 0; i < n; ++i) {
        k16[i] = kvt == DType::kF16 ? F32ToF16(k[i]) : F32ToBF16(k[i]);
        v16[i] = kvt == DType::kF16 ? F32ToF16(v[i]) : F32ToBF16(v[i]);
        kw[i] = kvt == DType::kF16 ? F16ToF32(k16[i]) : BF16ToF32(k16[i]);
        vw[i] = kvt == DType::kF16 ? F16ToF32(v16[i]) : BF16ToF32(v16[i]);
      }
      const int64_t q_stride = n_kv_head * kc.group * kc.head_dim;
      const std::vector<float> q = RandomVec(kc.n_tok * q_stride, seed++, 2.0f);
      const float scale = 1.0f / std::sqrt((float)kc.head_dim);
      const int64_t g = 1, h0 = g * kc.group, ko = g * kc.head_dim;
      std::vector<float> want(kc.n_tok * q_stride, 0.0f), got(kc.n_tok * q_stride, 0.0f), one(kc.group * kc.head_dim);
      std::vector<float> scores(kc.n_tok * kc.group * n_pos), sc(n_pos);
      cpu::GroupAttentionRowsWith(kt, q.data() + h0 * kc.head_dim, q_stride, kc.n_tok, kc.group, kw.data() + ko,
                                  vw.data() + ko, off.data(), kc.n_pos0, kc.head_dim, scale,
                                  want.data() + h0 * kc.head_dim, q_stride, scores.data(), kc.window);
      cpu::GroupAttentionRowsWith(kt, q.data() + h0 * kc.head_dim, q_stride, kc.n_tok, kc.group, k16.data() + ko,
                                  v16.data() + ko, kvt, off.data(), kc.n_pos0, kc.head_dim, scale,
                                  got.data() + h0 * kc.head_dim, q_stride, scores.data(), kc.window);
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i], want[i]) << IsaTierName(GetParam()) << " " << DTypeName(kvt) << " rows n_pos0=" << kc.n_pos0
                                   << " n_tok=" << kc.n_tok << " hd=" << kc.head_dim << " at " << i;
      }
      // The last token alone (the decode step's call).
      const int64_t t = kc.n_tok - 1, end = kc.n_pos0 + t + 1,
                    lo = kc.window > 0 ? std::max<int64_t>(0, end - kc.window) : 0;
      cpu::GroupAttentionWith(kt, q.data() + t * q_stride + h0 * kc.head_dim, kc.group, k16.data() + ko,
                              v16.data() + ko, kvt, off.data() + lo, end - lo, kc.head_dim, scale, one.data(),
                              sc.data());
      for (int64_t i = 0; i < kc.group * kc.head_dim; ++i) {
        ASSERT_EQ(one[i], want[t * q_stride + h0 * kc.head_dim + i])
            << IsaTierName(GetParam()) << " " << DTypeName(kvt) << " one token hd=" << kc.head_dim << " at " << i;
      }
    }
  }
}

// The bf16 cache on vdpbf16ps (the AVX-512 table where UsesBf16Dot): its definition written out on f32 FMAs
// (vdpbf16ps adds a pair's odd product, then its even one, each product exact in f32: one FMA each), with the
// tier's own softmax, gives the very bits, for runs of tokens (GroupAttentionRows) and one token
// (GroupAttention, the decode step's call) alike; head sizes 32 / 64 / 96 / 128, odd and even key counts, runs
// across the 16-position score blocks and the 64-position V blocks, windows. The other head sizes keep the f32
// arithmetic on the widened values. And against the double definition on the bf16 values: within bf16's
// rounding of q and the probabilities.
TEST(AttentionBf16Kv, Bf16KvOnVdpbf16ps) {
  LATHE_REQUIRE_TIER(IsaTier::kAvx512);
  const cpu::KernelTable& kt = cpu::KernelsFor(IsaTier::kAvx512);
  if (!Bf16KvOnDot(kt)) GTEST_SKIP() << "the bf16 products do not run on vdpbf16ps here (UsesBf16Dot)";
  uint32_t seed = 2600;
  const RunCase cases[] = {{0, 1, 3, 64},    {36, 1, 3, 64},  {37, 1, 3, 64},   {0, 70, 3, 64},  {63, 2, 3, 64},
                           {100, 9, 2, 128}, {5, 16, 4, 32},  {0, 33, 2, 96},   {61, 9, 4, 128}, {127, 6, 3, 64},
                           {0, 130, 1, 32},  {200, 16, 3, 64}, {5, 16, 3, 64, 12}, {100, 70, 1, 64, 64},
                           {0, 130, 2, 32, 129}, {7, 5, 3, 20}, {60, 9, 3, 24}};
  const int64_t block_size = 16, n_kv_head = 2;
  const auto softmax = cpu::avx512::Table().softmax;
  for (const RunCase& kc : cases) {
    const int hd = kc.head_dim;
    const bool dot = hd % 32 == 0;
    const int64_t n_pos = kc.n_pos0 + kc.n_tok, kv_dim = n_kv_head * hd;
    int64_t pool_blocks;
    const std::vector<int64_t> off = ScatteredOffsets(n_pos, block_size, kv_dim, &pool_blocks);
    const size_t n = (size_t)(pool_blocks * block_size * kv_dim);
    const std::vector<float> k = RandomVec(n, seed++, 3.0f), v = RandomVec(n, seed++, 3.0f);
    std::vector<uint16_t> k16(n), v16(n);
    std::vector<float> kw(n), vw(n);
    for (size_t i = 0; i < n; ++i) {
      k16[i] = F32ToBF16(k[i]), v16[i] = F32ToBF16(v[i]);
      kw[i] = BF16ToF32(k16[i]), vw[i] = BF16ToF32(v16[i]);
    }
    const int64_t q_stride = n_kv_head * kc.group * hd;
    const std::vector<float> q = RandomVec(kc.n_tok * q_stride, seed++, 2.0f);
    const float scale = 1.0f / std::sqrt((float)hd);
    const int64_t g = 1, h0 = g * kc.group, ko = g * hd;
    // The definition, row by row: keys [lo, end) of token t.
    std::vector<float> want(kc.n_tok * q_stride, 0.0f), exact(kc.n_tok * q_stride, 0.0f);
    for (int64_t t = 0; t < kc.n_tok; ++t) {
      const int64_t end = kc.n_pos0 + t + 1, lo = kc.window > 0 ? std::max<int64_t>(0, end - kc.window) : 0;
      const int64_t nk = end - lo;
      for (int h = 0; h < kc.group; ++h) {
        const float* qr = q.data() + t * q_stride + (h0 + h) * hd;
        std::vector<float> qb(hd), s(nk + 1, 0.0f);
        for (int i = 0; i < hd; ++i) qb[i] = BF16ToF32(F32ToBF16(qr[i]));
        for (int64_t p = 0; p < nk; ++p) {
          const float* kr = kw.data() + ko + off[lo + p];
          float a = 0.0f;
          for (int i = 0; i < hd; i += 2) a = std::fma(qb[i], kr[i], std::fma(qb[i + 1], kr[i + 1], a));
          s[p] = a * scale;
        }
        softmax(s.data(), nk);
        std::vector<float> pr(nk + 1, 0.0f);
        for (int64_t p = 0; p < nk; ++p) pr[p] = BF16ToF32(F32ToBF16(s[p]));
        float* o = want.data() + t * q_stride + (h0 + h) * hd;
        for (int i = 0; i < hd; ++i) {
          float a = 0.0f;
          for (int64_t p = 0; p < nk; p += 2) {
            const float v1 = p + 1 < nk ? vw[ko + off[lo + p + 1] + i] : 0.0f;
            a = std::fma(pr[p], vw[ko + off[lo + p] + i], std::fma(pr[p + 1], v1, a));
          }
          o[i] = a;
        }
        // The double definition on the bf16 cache and the f32 q.
        std::vector<double> sd(nk);
        double mx = -1e300, sum = 0;
        for (int64_t p = 0; p < nk; ++p) {
          double d = 0;
          for (int i = 0; i < hd; ++i) d += (double)qr[i] * kw[ko + off[lo + p] + i];
          mx = std::max(mx, sd[p] = d * scale);
        }
        for (auto& x : sd) sum += (x = std::exp(x - mx));
        for (int i = 0; i < hd; ++i) {
          double a = 0;
          for (int64_t p = 0; p < nk; ++p) a += sd[p] / sum * vw[ko + off[lo + p] + i];
          exact[t * q_stride + (h0 + h) * hd + i] = (float)a;
        }
      }
    }
    std::vector<float> got(kc.n_tok * q_stride, 0.0f), one(kc.group * hd), scores(kc.n_tok * kc.group * n_pos),
        sc(n_pos);
    cpu::GroupAttentionRowsWith(kt, q.data() + h0 * hd, q_stride, kc.n_tok, kc.group, k16.data() + ko,
                                v16.data() + ko, DType::kBF16, off.data(), kc.n_pos0, hd, scale, got.data() + h0 * hd,
                                q_stride, scores.data(), kc.window);
    if (!dot) {  // the f32 arithmetic on the widened values
      cpu::GroupAttentionRowsWith(kt, q.data() + h0 * hd, q_stride, kc.n_tok, kc.group, kw.data() + ko,
                                  vw.data() + ko, off.data(), kc.n_pos0, hd, scale, want.data() + h0 * hd, q_stride,
                                  scores.data(), kc.window);
    }
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << "rows n_pos0=" << kc.n_pos0 << " n_tok=" << kc.n_tok << " hd=" << hd
                                 << " window=" << kc.window << " at " << i;
    }
    if (dot) {
      EXPECT_LE(NormalizedError(got, exact), 1e-2) << "n_pos0=" << kc.n_pos0 << " hd=" << hd;
    }
    for (int64_t t = 0; t < kc.n_tok; ++t) {  // each token alone (a decode step's call)
      const int64_t end = kc.n_pos0 + t + 1, lo = kc.window > 0 ? std::max<int64_t>(0, end - kc.window) : 0;
      cpu::GroupAttentionWith(kt, q.data() + t * q_stride + h0 * hd, kc.group, k16.data() + ko, v16.data() + ko,
                              DType::kBF16, off.data() + lo, end - lo, hd, scale, one.data(), sc.data());
      for (int64_t i = 0; i < kc.group * hd; ++i) {
        ASSERT_EQ(one[i], want[t * q_stride + h0 * hd + i])
            << "one token t=" << t << " n_pos0=" << kc.n_pos0 << " hd=" << hd << " at " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, AttentionTier, ::testing::ValuesIn(AllTiers()), testing::TierParamName);

TEST(AttentionPublic, FirstTokenCopiesValue) {
  // With one key, the softmax weight is exactly 1: out = v.
  ThreadPool pool(2);
  const std::vector<float> q = RandomVec(4 * 16, 1), k = RandomVec(2 * 16, 2), v = RandomVec(2 * 16, 3);
  std::vector<float> out(4 * 16);
  Attention(pool, q.data(), 64, k.data(), v.data(), 32, 1, 0, 4, 2, 16, 0.25f, out.data(), 64);
  for (int h = 0; h < 4; ++h)
    for (int i = 0; i < 16; ++i) EXPECT_FLOAT_EQ(out[h * 16 + i], v[(h / 2) * 16 + i]) << h << " " << i;
}

}  // namespace
}  // namespace lathe::kernels
