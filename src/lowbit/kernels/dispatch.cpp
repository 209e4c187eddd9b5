#include "dispatch.h"

#include <cpuid.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>

namespace lowbit {
namespace {

std::atomic<int> g_cpuid_queries{0};

uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}

CpuFeatures detect() {
  g_cpuid_queries.fetch_add(1);
  CpuFeatures f;
  unsigned a, b, c, d;
  if (__get_cpuid(0, &a, &b, &c, &d)) f.amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // AuthenticAMD
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  f.family = (int)((a >> 8) & 0xf) + ((((a >> 8) & 0xf) == 0xf) ? (int)((a >> 20) & 0xff) : 0);
  const bool osxsave = c & (1u << 27);
  f.fma = c & (1u << 12);
  f.f16c = c & (1u << 29);
  const bool avx = c & (1u << 28);
  if (osxsave && avx) {
    const uint64_t xcr0 = xgetbv0();
    f.os_avx = (xcr0 & 0x6) == 0x6;
    f.os_avx512 = f.os_avx && (xcr0 & 0xe0) == 0xe0;
    f.os_amx = (xcr0 & 0x60000) == 0x60000;  // XTILECFG + XTILEDATA
  }
  if (__get_cpuid_max(0, nullptr) >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = b & (1u << 5);
    f.avx512f = b & (1u << 16);
    f.avx512dq = b & (1u << 17);
    f.avx512bw = b & (1u << 30);
    f.avx512vl = b & (1u << 31);
    f.avx512vnni = c & (1u << 11);
    f.avx512vbmi = c & (1u << 1);
    f.gfni = c & (1u << 8);
    f.amx_tile = d & (1u << 24);
    f.amx_int8 = d & (1u << 25);
    __cpuid_count(7, 1, a, b, c, d);
    f.avxvnni = a & (1u << 4);
  }
  return f;
}

// One immutable State per requested level, published through an atomic pointer: a kernel that reads
// the active table while set_isa runs sees the old or the new one, never a half-written one.
struct State {
  std::string isa, reason;
  const KernelTable* table = nullptr;
};
std::atomic<const State*> g_state{nullptr};
std::mutex g_apply_mu;

bool has_avx2(const CpuFeatures& f) { return f.os_avx && f.avx2 && f.fma && f.f16c; }
bool has_avx512(const CpuFeatures& f) {
  return has_avx2(f) && f.os_avx512 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni;
}
bool has_amx(const CpuFeatures& f) {
  return has_avx512(f) && f.gfni && f.amx_tile && f.amx_int8 && f.os_amx && amx_tile_permission();
}
bool has_avxvnni_vex(const CpuFeatures& f) { return has_avx2(f) && f.avxvnni && kernels_avxvnni() != nullptr; }

void apply(const std::string& requested) {
  const CpuFeatures& f = cpu_features();
  std::lock_guard<std::mutex> lock(g_apply_mu);
  static std::map<std::string, State*> made;  // never freed: readers may still hold the old one
  if (auto it = made.find(requested); it != made.end()) {
    g_state.store(it->second, std::memory_order_release);
    return;
  }
  State tmp;
  State& s = tmp;
  std::string name = requested;
  const bool forced = !(name.empty() || name == "auto");
  if (!forced) name = available_isas().front();
  if (name == "amx") {
    if (!has_amx(f)) throw std::invalid_argument("LOWBIT_ISA=amx: this CPU lacks AMX-TILE/AMX-INT8 (with AVX-512 VNNI), or the OS does not grant the tile state");
    s.table = &kernels_amx();
    s.reason = "AMX-INT8 present: tdpbsud tiles for 8 tokens or more (16 x 16 x 64 MACs each), AVX-512 VNNI below that";
  } else if (name == "avx512") {
    if (!has_avx512(f)) throw std::invalid_argument("LOWBIT_ISA=avx512: this CPU lacks AVX-512 F/BW/VL/DQ with VNNI (or the OS does not enable the zmm state)");
    s.table = &kernels_avx512();
    s.reason = "AVX-512 F/BW/VL/DQ + VNNI present: vpdpbusd on zmm, 64 u8 x s8 products per instruction";
  } else if (name == "avxvnni") {
    if (has_avxvnni_vex(f)) {
      s.table = kernels_avxvnni();
      s.reason = "AVX2 + AVX-VNNI: vpdpbusd on ymm (VEX)";
    } else if (has_avx512(f)) {
      s.table = &kernels_avxvnni_evex();
      s.reason = "ymm VNNI kernels in their EVEX encoding: this CPU has AVX512-VNNI+VL but not VEX AVX-VNNI";
    } else {
      throw std::invalid_argument("LOWBIT_ISA=avxvnni: this CPU lacks AVX-VNNI (and AVX512-VNNI+VL)");
    }
  } else if (name == "avx2") {
    if (!has_avx2(f)) throw std::invalid_argument("LOWBIT_ISA=avx2: this CPU lacks AVX2/FMA/F16C");
    s.table = &kernels_avx2();
    s.reason = "AVX2 + FMA + F16C without VNNI: vpmaddubsw + vpmaddwd";
  } else if (name == "scalar") {
    s.table = &kernels_scalar();
    s.reason = "portable C++ (no SIMD level requested or available)";
  } else {
    throw std::invalid_argument("unknown ISA '" + requested + "': use amx, avx512, avxvnni, avx2, scalar or auto");
  }
  if (forced) s.reason = "forced by LOWBIT_ISA/set_isa; " + s.reason;
  else s.reason = "best level this CPU supports; " + s.reason;
  s.isa = name;
  State* published = new State(tmp);
  made[requested] = published;
  g_state.store(published, std::memory_order_release);
}

const State& state() {
  const State* s = g_state.load(std::memory_order_acquire);
  if (s) return *s;
  const char* env = std::getenv("LOWBIT_ISA");
  apply(env ? env : "auto");
  return *g_state.load(std::memory_order_acquire);
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

std::vector<std::string> available_isas() {
  const CpuFeatures& f = cpu_features();
  std::vector<std::string> v;
  if (has_amx(f)) v.push_back("amx");
  if (has_avx512(f)) v.push_back("avx512");
  if (has_avxvnni_vex(f) || has_avx512(f)) v.push_back("avxvnni");
  if (has_avx2(f)) v.push_back("avx2");
  v.push_back("scalar");
  return v;
}

void select_isa(const std::string& name) { apply(name); }
const std::string& selected_isa() { return state().isa; }
const std::string& isa_reason() { return state().reason; }
const KernelTable& active_kernels() { return *state().table; }
int cpuid_queries() { return g_cpuid_queries.load(); }

namespace {
struct StreamPrefetch {
  bool l1;
  std::string reason;
};
const StreamPrefetch& stream_prefetch() {
  static const StreamPrefetch p = [] {
    const char* env = std::getenv("LOWBIT_STREAM_PREFETCH");
    const std::string e = env ? env : "";
    if (e == "l1" || e == "L1") return StreamPrefetch{true, "l1 (LOWBIT_STREAM_PREFETCH)"};
    if (e == "l2" || e == "L2") return StreamPrefetch{false, "l2 (LOWBIT_STREAM_PREFETCH)"};
    // not an error: this is read while the module loads (a hint, it cannot make a result wrong)
    const std::string note = e.empty() ? "" : "; LOWBIT_STREAM_PREFETCH='" + e + "' is not l1 or l2, ignored";
    const CpuFeatures& f = cpu_features();
    if (f.amd && f.family >= 0x1a) return StreamPrefetch{true, "l1 (AMD family 0x1a or later: Zen 5" + note + ")"};
    return StreamPrefetch{false, "l2 (the default off a Zen 5" + note + ")"};
  }();
  return p;
}
}  // namespace

bool stream_prefetch_l1() { return stream_prefetch().l1; }
const std::string& stream_prefetch_reason() { return stream_prefetch().reason; }

// On the heap: a fork() child cannot unlock the copy its parent's thread locked (glibc checks the
// writer's thread id), so the child replaces it (the old one is leaked).
std::shared_mutex* g_settings = new std::shared_mutex();
std::shared_mutex& settings_mutex() { return *g_settings; }
void settings_mutex_renew_in_child() { g_settings = new std::shared_mutex(); }

}  // namespace lowbit
