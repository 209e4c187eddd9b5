// One persistent pool of worker threads. Work is a count of tasks handed out dynamically through an
// atomic counter, so a core that is slower (hybrid CPUs, a shared machine) simply takes fewer tasks.
// Workers spin for at most kSpinTime after a job (decode calls come every few microseconds), then sleep:
// an idle process burns no CPU. The pool survives fork(): the child starts its own workers on first use.
#pragma once
#include <cstdint>
#include <string>

namespace lowbit {

using TaskFn = void (*)(void* ctx, int64_t task);

constexpr int kMaxThreads = 1024;

void pool_set_threads(int n);   // 1 <= n <= kMaxThreads; the caller is one of them
int pool_threads();
// Runs fn(ctx, t) for t in [0, ntasks) on the pool and the calling thread; returns when all are done.
void pool_run(int64_t ntasks, TaskFn fn, void* ctx);
// What the caller will stream right after this run (the decode schedule across matrices): a thread that
// runs out of tasks prefetches up to `bytes` from starts[tid % n] into its L2 while it waits — the caller
// until the others finish, a worker until the next run starts (through the caller's serial work between
// runs) — in small slices, so the wait ends as soon as it would have. The memory stream keeps going
// through the join. Prefetches are hints: a stale address cannot fault.
struct NextPrefetch {
  static constexpr int kMax = 8;
  const char* starts[kMax] = {};
  int n = 0;
  int64_t bytes = 0;
};
void pool_run(int64_t ntasks, TaskFn fn, void* ctx, const NextPrefetch* next);
// fn(ctx, r) for every row r in [0, n) of independent rows, on the pool in runs of rows: ~4 tasks a thread, not
// one a row. Each task's ticket is an atomic on a line every thread claims from; a prefill chunk's row passes (128
// rows, 5 a layer) paid ~128 of them a pass (bitnet-0.7b pp128, 2 threads, scripts/prefill_ab.py: 1.02-1.05x median
// with 4, 1, 2 or 8 tasks a thread).
void pool_run_rows(int64_t n, TaskFn fn, void* ctx);
// Workers parked on the condition variable (not spinning) right now: for the idle test.
int pool_sleeping();

// Cheap timestamps for profiling: the TSC on x86 (steady_clock nanoseconds elsewhere).
uint64_t cycle_ticks();
// Profiling of the join, off by default (then a task costs one relaxed load more): while on, every pool
// run adds the mean over its threads of the time each sat idle at the join (from its last task, or from
// the start of the run if it got none, to the end of the run) to a counter, in cycle_ticks().
void pool_profile_join(bool on);
uint64_t pool_join_idle_ticks();

// Distinct physical cores (SMT siblings once) among the CPUs this process may run on (sched_getaffinity),
// from sysfs topology; the affinity count where sysfs is missing.
int physical_cores();
int affinity_cpus();
// CPUs granted by the cgroup CPU quota (v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us) of this
// process, the tightest along its cgroup path; <= 0 when there is no quota. root / self_cgroup are the
// cgroup mount root and /proc/self/cgroup (parameters so tests can point them at a fake tree).
double cgroup_cpu_limit(const std::string& root = "/sys/fs/cgroup", const std::string& self_cgroup = "/proc/self/cgroup");
// The default thread count: physical cores in the affinity mask, capped by the cgroup quota (rounded up).
int default_threads();

}  // namespace lowbit
