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
const KernelTable& active_kernels();

}  // namespace lowbit
