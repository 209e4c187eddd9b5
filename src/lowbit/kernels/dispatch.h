// Run-time choice of the kernel set: detected once, overridable with LOWBIT_ISA or set_isa().
#pragma once
#include <shared_mutex>
#include <string>
#include <vector>

#include "common.h"

namespace lowbit {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false, avxvnni = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512vnni = false, avx512vbmi = false;
  bool amx_tile = false, amx_int8 = false, os_amx = false, gfni = false;
  bool os_avx = false, os_avx512 = false;
  bool amd = false;
  int family = 0;  // CPUID's display family (base + extended): 0x19 Zen 3 / Zen 4, 0x1A Zen 5
};

const CpuFeatures& cpu_features();
// Levels this CPU can run, best first ("amx", "avx512", "avxvnni", "avx2", "scalar").
std::vector<std::string> available_isas();
// Selects a level; "auto" or "" picks the best. Throws std::invalid_argument if unknown or unsupported.
void select_isa(const std::string& name);
const std::string& selected_isa();
// How many times CPUID was executed (once per process: cpu_features() caches it); for the test that the
// dispatch decision is cached, not re-made per call.
int cpuid_queries();
// Kernel calls hold this shared for their whole run; set_isa and set_threads take it exclusively, so the
// ISA or the pool never changes under a running kernel (they wait for it). Also held across fork().
std::shared_mutex& settings_mutex();
void settings_mutex_renew_in_child();  // fork() child handler only
const std::string& isa_reason();
// Where the compute-heavy kernels prefetch their weight stream (the codebook Psumbook kernels, rsr-lut, the prefill
// GEMM's code panels): into L1 (T0, true) or into L2 (T1 / T2, false). Which pays depends on the core: on a Zen 4
// L2 ran the codebook b = 4 GEMV from DRAM 1.2-1.4x faster than L1 (stop 39), on a Zen 5 L1 ran it ~1.17x faster
// than L2 (m2v4b4g128 0.65-0.72x -> 0.74-0.85x ternary at Llama3-8B's shapes, 1 thread), rsr-lut's binary 2^15
// one-token GEMV 1.05x, the prefill GEMM 1.00-1.03x. L1 on AMD family 0x1A and later, L2 elsewhere (the choice
// measured before); LOWBIT_STREAM_PREFETCH=l1 or l2 overrides it. Decided once; a hint: no result depends on it.
bool stream_prefetch_l1();
// "l1 (...)" / "l2 (...)": the choice and why, for cpu_info().
const std::string& stream_prefetch_reason();
const KernelTable& active_kernels();

}  // namespace lowbit
