// L1 probe of the AVX2 panel GEMM's inner loop (gemm_panel_avx2.inc) against the int8 roof loop, and of
// alternative register tiles; everything in L1, best of 400 short runs each (robust on a shared machine).
//   g++ -O2 -mavx2 -mfma -o /tmp/panel_l1_probe scripts/panel_l1_probe.cpp && /tmp/panel_l1_probe 40
// Variants (% of the roof loop's vpmaddubsw rate; Zen 3, 2026-11-23, loaded shared machine, min-based):
//   cur       the kernel's 6 tokens x 16 rows loop (2 loads + 6 vpbroadcastd m32 per 12 vpmaddubsw): 87-89 %
//   prebcast  activations pre-broadcast, vpmaddubsw memory operands (14 loads, no broadcast):      84-86 %
//   wmem7     u8 acts broadcast, s8 weights as memory operands, 7 tokens x 2 halves:                71-72 %
//   halfbcast cur with 3 of 6 broadcasts dropped (wrong sums: only says what the broadcasts cost):  93-95 %
//   cur4      cur unrolled to 4 steps an iteration:                                                 87-88 %
//   u43       u8 acts broadcast, s8 weights, 4 tokens x 3 halves (2 in registers, 1 memory operand): 92 %
// So the broadcasts, not the ALU ops, keep the loop below the roof; u43 would need u8 activations (q ^ 0x80)
// and s8 (centred) codes with a per-row code-sum correction, and 24-row tiles.
#include <chrono>
#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <immintrin.h>
// L1 probes: vpmaddubsw per ns of loop variants, steps over an L1 panel, repeated.
alignas(64) static uint8_t panel[64 * 64 * 40];   // up to 40 steps x 64 B per pair... 
alignas(64) static int8_t acts[6 * 4096];
alignas(64) static uint8_t bacts[6 * 40 * 32];    // pre-broadcast acts: [step][token][32]
alignas(64) static int32_t accm[6*64];
#define P2(A, B, addr) "vpbroadcastd " addr ", %%ymm14\n\t" "vpmaddubsw %%ymm14, %%ymm12, %%ymm15\n\t" "vpaddw %%ymm15, %%ymm" #A ", %%ymm" #A "\n\t" "vpmaddubsw %%ymm14, %%ymm13, %%ymm15\n\t" "vpaddw %%ymm15, %%ymm" #B ", %%ymm" #B "\n\t"
#define PW(off) "vmovdqa " off "(%[w]), %%ymm12\n\tvmovdqa " off "+32(%[w]), %%ymm13\n\t"
double roof(int64_t iters) {
  auto t0 = std::chrono::steady_clock::now();
  int64_t n = iters;
  __asm__ volatile("vpcmpeqb %%ymm12, %%ymm12, %%ymm12\n\tvpabsb %%ymm12, %%ymm13\n\tvpsrlw $1, %%ymm12, %%ymm14\n\t1:\n\t"
#define R(A) "vpmaddubsw %%ymm14, %%ymm12, %%ymm15\n\tvpaddw %%ymm15, %%ymm" #A ", %%ymm" #A "\n\t"
    R(0) R(1) R(2) R(3) R(4) R(5) R(6) R(7) R(8) R(9) R(10) R(11)
    "dec %[n]\n\tjnz 1b\n\tvzeroupper\n\t" : [n] "+r"(n) :: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","cc");
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / (iters * 12.0);
}
// (a) current loop: steps per call (even), reps calls
double cur(int64_t reps, int64_t steps, int64_t kp) {
  auto t0 = std::chrono::steady_clock::now();
  const int64_t kp3 = 3 * kp;
  for (int64_t r = 0; r < reps; ++r) {
    const uint8_t* w = panel; const int8_t* q = acts; const int8_t* q4 = acts + 4 * kp; int64_t n = steps;
    __asm__ volatile("1:\n\t" PW("0")
      P2(0, 1, "(%[q])") P2(2, 3, "(%[q],%[kp],1)") P2(4, 5, "(%[q],%[kp],2)") P2(6, 7, "(%[q],%[kp3],1)") P2(8, 9, "(%[q4])") P2(10, 11, "(%[q4],%[kp],1)")
      PW("64")
      P2(0, 1, "4(%[q])") P2(2, 3, "4(%[q],%[kp],1)") P2(4, 5, "4(%[q],%[kp],2)") P2(6, 7, "4(%[q],%[kp3],1)") P2(8, 9, "4(%[q4])") P2(10, 11, "4(%[q4],%[kp],1)")
      "add $128, %[w]\n\tadd $8, %[q]\n\tadd $8, %[q4]\n\tsub $2, %[n]\n\tjnz 1b\n\t"
      : [w] "+r"(w), [q] "+r"(q), [q4] "+r"(q4), [n] "+r"(n) : [kp] "r"(kp), [kp3] "r"(kp3)
      : "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","cc","memory");
  }
  __asm__ volatile("vzeroupper" ::: "memory");
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / (reps * steps * 12.0);
}
// (b) pre-broadcast activations as memory operands: [step][token][32]
#define PB(A, B, off) "vpmaddubsw " off "(%[b]), %%ymm12, %%ymm15\n\tvpaddw %%ymm15, %%ymm" #A ", %%ymm" #A "\n\t" "vpmaddubsw " off "(%[b]), %%ymm13, %%ymm14\n\tvpaddw %%ymm14, %%ymm" #B ", %%ymm" #B "\n\t"
double bc(int64_t reps, int64_t steps) {
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < reps; ++r) {
    const uint8_t* w = panel; const uint8_t* b = bacts; int64_t n = steps;
    __asm__ volatile("1:\n\t" PW("0") PB(0,1,"0") PB(2,3,"32") PB(4,5,"64") PB(6,7,"96") PB(8,9,"128") PB(10,11,"160")
      PW("64") PB(0,1,"192") PB(2,3,"224") PB(4,5,"256") PB(6,7,"288") PB(8,9,"320") PB(10,11,"352")
      "add $128, %[w]\n\tadd $384, %[b]\n\tsub $2, %[n]\n\tjnz 1b\n\t"
      : [w] "+r"(w), [b] "+r"(b), [n] "+r"(n) :
      : "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","cc","memory");
  }
  __asm__ volatile("vzeroupper" ::: "memory");
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / (reps * steps * 12.0);
}
// (c) weights (s8) as memory operands, acts (u8) broadcast in a register: 7 tokens x 2 halves = 14 acc
#define PC(A, B, addr) "vpbroadcastd " addr ", %%ymm14\n\t" "vpmaddubsw (%[w]), %%ymm14, %%ymm15\n\t" "vpaddw %%ymm15, %%ymm" #A ", %%ymm" #A "\n\t" "vpmaddubsw 32(%[w]), %%ymm14, %%ymm15\n\t" "vpaddw %%ymm15, %%ymm" #B ", %%ymm" #B "\n\t"
#define PC2(A, B, addr) "vpbroadcastd " addr ", %%ymm14\n\t" "vpmaddubsw 64(%[w]), %%ymm14, %%ymm15\n\t" "vpaddw %%ymm15, %%ymm" #A ", %%ymm" #A "\n\t" "vpmaddubsw 96(%[w]), %%ymm14, %%ymm15\n\t" "vpaddw %%ymm15, %%ymm" #B ", %%ymm" #B "\n\t"
double wm(int64_t reps, int64_t steps, int64_t kp) {
  auto t0 = std::chrono::steady_clock::now();
  const int64_t kp3 = 3 * kp;
  for (int64_t r = 0; r < reps; ++r) {
    const uint8_t* w = panel; const int8_t* q = acts; const int8_t* q4 = acts + 4 * kp; int64_t n = steps;
    __asm__ volatile("1:\n\t"
      PC(0, 1, "(%[q])") PC(2, 3, "(%[q],%[kp],1)") PC(4, 5, "(%[q],%[kp],2)") PC(6, 7, "(%[q],%[kp3],1)") PC(8, 9, "(%[q4])") PC(10, 11, "(%[q4],%[kp],1)") PC(12, 13, "(%[q4],%[kp],2)")
      PC2(0, 1, "4(%[q])") PC2(2, 3, "4(%[q],%[kp],1)") PC2(4, 5, "4(%[q],%[kp],2)") PC2(6, 7, "4(%[q],%[kp3],1)") PC2(8, 9, "4(%[q4])") PC2(10, 11, "4(%[q4],%[kp],1)") PC2(12, 13, "4(%[q4],%[kp],2)")
      "add $128, %[w]\n\tadd $8, %[q]\n\tadd $8, %[q4]\n\tsub $2, %[n]\n\tjnz 1b\n\t"
      : [w] "+r"(w), [q] "+r"(q), [q4] "+r"(q4), [n] "+r"(n) : [kp] "r"(kp), [kp3] "r"(kp3)
      : "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","cc","memory");
  }
  __asm__ volatile("vzeroupper" ::: "memory");
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / (reps * steps * 14.0);
}

// (d) like cur, but tokens 1,3,5 reuse the previous broadcast (3 broadcasts per step: op-count probe only)
#define P2N(A, B) "vpmaddubsw %%ymm14, %%ymm12, %%ymm15\n\t" "vpaddw %%ymm15, %%ymm" #A ", %%ymm" #A "\n\t" "vpmaddubsw %%ymm14, %%ymm13, %%ymm15\n\t" "vpaddw %%ymm15, %%ymm" #B ", %%ymm" #B "\n\t"
double half(int64_t reps, int64_t steps, int64_t kp) {
  auto t0 = std::chrono::steady_clock::now();
  const int64_t kp3 = 3 * kp;
  for (int64_t r = 0; r < reps; ++r) {
    const uint8_t* w = panel; const int8_t* q = acts; const int8_t* q4 = acts + 4 * kp; int64_t n = steps;
    __asm__ volatile("1:\n\t" PW("0")
      P2(0, 1, "(%[q])") P2N(2, 3) P2(4, 5, "(%[q],%[kp],2)") P2N(6, 7) P2(8, 9, "(%[q4])") P2N(10, 11)
      PW("64")
      P2(0, 1, "4(%[q])") P2N(2, 3) P2(4, 5, "4(%[q],%[kp],2)") P2N(6, 7) P2(8, 9, "4(%[q4])") P2N(10, 11)
      "add $128, %[w]\n\tadd $8, %[q]\n\tadd $8, %[q4]\n\tsub $2, %[n]\n\tjnz 1b\n\t"
      : [w] "+r"(w), [q] "+r"(q), [q4] "+r"(q4), [n] "+r"(n) : [kp] "r"(kp), [kp3] "r"(kp3)
      : "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","cc","memory");
  }
  __asm__ volatile("vzeroupper" ::: "memory");
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / (reps * steps * 12.0);
}
// (e) cur unrolled to 4 steps per iteration
double cur4(int64_t reps, int64_t steps, int64_t kp) {
  auto t0 = std::chrono::steady_clock::now();
  const int64_t kp3 = 3 * kp;
  for (int64_t r = 0; r < reps; ++r) {
    const uint8_t* w = panel; const int8_t* q = acts; const int8_t* q4 = acts + 4 * kp; int64_t n = steps;
    __asm__ volatile("1:\n\t" PW("0")
      P2(0, 1, "(%[q])") P2(2, 3, "(%[q],%[kp],1)") P2(4, 5, "(%[q],%[kp],2)") P2(6, 7, "(%[q],%[kp3],1)") P2(8, 9, "(%[q4])") P2(10, 11, "(%[q4],%[kp],1)")
      PW("64")
      P2(0, 1, "4(%[q])") P2(2, 3, "4(%[q],%[kp],1)") P2(4, 5, "4(%[q],%[kp],2)") P2(6, 7, "4(%[q],%[kp3],1)") P2(8, 9, "4(%[q4])") P2(10, 11, "4(%[q4],%[kp],1)")
      PW("128")
      P2(0, 1, "8(%[q])") P2(2, 3, "8(%[q],%[kp],1)") P2(4, 5, "8(%[q],%[kp],2)") P2(6, 7, "8(%[q],%[kp3],1)") P2(8, 9, "8(%[q4])") P2(10, 11, "8(%[q4],%[kp],1)")
      PW("192")
      P2(0, 1, "12(%[q])") P2(2, 3, "12(%[q],%[kp],1)") P2(4, 5, "12(%[q],%[kp],2)") P2(6, 7, "12(%[q],%[kp3],1)") P2(8, 9, "12(%[q4])") P2(10, 11, "12(%[q4],%[kp],1)")
      "add $256, %[w]\n\tadd $16, %[q]\n\tadd $16, %[q4]\n\tsub $4, %[n]\n\tjnz 1b\n\t"
      : [w] "+r"(w), [q] "+r"(q), [q4] "+r"(q4), [n] "+r"(n) : [kp] "r"(kp), [kp3] "r"(kp3)
      : "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","cc","memory");
  }
  __asm__ volatile("vzeroupper" ::: "memory");
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / (reps * steps * 12.0);
}

// (f) u8 activations broadcast, s8 weights: 4 tokens x 3 halves, halves 0-1 in registers, half 2 a memory operand
#define PU(A, B, C, addr, woff) "vpbroadcastd " addr ", %%ymm14\n\t" \
  "vpmaddubsw %%ymm12, %%ymm14, %%ymm15\n\t" "vpaddw %%ymm15, %%ymm" #A ", %%ymm" #A "\n\t" \
  "vpmaddubsw %%ymm13, %%ymm14, %%ymm15\n\t" "vpaddw %%ymm15, %%ymm" #B ", %%ymm" #B "\n\t" \
  "vpmaddubsw " woff "(%[w]), %%ymm14, %%ymm14\n\t" "vpaddw %%ymm14, %%ymm" #C ", %%ymm" #C "\n\t"
#define PW3(off) "vmovdqa " off "(%[w]), %%ymm12\n\tvmovdqa " off "+32(%[w]), %%ymm13\n\t"
double u43(int64_t reps, int64_t steps, int64_t kp) {
  auto t0 = std::chrono::steady_clock::now();
  const int64_t kp3 = 3 * kp;
  for (int64_t r = 0; r < reps; ++r) {
    const uint8_t* w = panel; const int8_t* q = acts; int64_t n = steps;
    __asm__ volatile("1:\n\t" PW3("0")
      PU(0, 1, 2, "(%[q])", "64") PU(3, 4, 5, "(%[q],%[kp],1)", "64") PU(6, 7, 8, "(%[q],%[kp],2)", "64") PU(9, 10, 11, "(%[q],%[kp3],1)", "64")
      PW3("96")
      PU(0, 1, 2, "4(%[q])", "160") PU(3, 4, 5, "4(%[q],%[kp],1)", "160") PU(6, 7, 8, "4(%[q],%[kp],2)", "160") PU(9, 10, 11, "4(%[q],%[kp3],1)", "160")
      "add $192, %[w]\n\tadd $8, %[q]\n\tsub $2, %[n]\n\tjnz 1b\n\t"
      : [w] "+r"(w), [q] "+r"(q), [n] "+r"(n) : [kp] "r"(kp), [kp3] "r"(kp3)
      : "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","cc","memory");
  }
  __asm__ volatile("vzeroupper" ::: "memory");
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / (reps * steps * 12.0);
}
int main(int argc, char** argv) {
  int64_t steps = argc > 1 ? atoll(argv[1]) : 40;
  double r = 1, a = 1, b = 1, c = 1, d = 1, e = 1, f = 1;
  for (int i = 0; i < 400; ++i) {
    r = std::min(r, roof(200000));
    a = std::min(a, cur(20000 / steps * 40, steps, 160));
    b = std::min(b, bc(20000 / steps * 40, steps));
    c = std::min(c, wm(20000 / steps * 40, steps, 160));
    d = std::min(d, half(20000 / steps * 40, steps, 160));
    e = std::min(e, cur4(20000 / steps * 40, steps, 160));
    f = std::min(f, u43(20000 / steps * 40, steps, 160));
  }
  printf("roof %.3f ns/op; cur %.1f%%  prebcast %.1f%%  wmem7 %.1f%% halfbcast %.1f%% cur4 %.1f%% u43 %.1f%%\n", r * 1e9, 100 * r / a, 100 * r / b, 100 * r / c, 100 * r / d, 100 * r / e, 100 * r / f);
}
