#include "thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dispatch.h"
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <x86intrin.h>
#define LOWBIT_PAUSE() _mm_pause()
#else
#define LOWBIT_PAUSE() ((void)0)
#endif

namespace lowbit {
namespace {

using Clock = std::chrono::steady_clock;
// An idle worker spins this long after its last job (the decoder's next pool run comes within
// microseconds), then sleeps on the condition variable: an idle process costs ~0 CPU.
constexpr auto kSpinTime = std::chrono::microseconds(500);
constexpr int64_t kPrefetchSlice = 1024;  // idle prefetch per spin iteration
constexpr int kPauseIters = 1 << 11;  // then yield between pauses: on an oversubscribed machine (other
                                      // processes on our cores) a descheduled thread must get to run

// Tasks are claimed from one 64-bit ticket, job generation | task count | next index, so a worker that
// wakes late (a sleeping vCPU can take milliseconds) can never take a task of a later job, and the
// caller waits only for tasks, not for workers: if a worker is slow to wake, the caller runs its share.
constexpr int kIdxBits = 20;
constexpr uint64_t kIdxMask = (1u << kIdxBits) - 1;
constexpr int64_t kMaxTasks = (int64_t)kIdxMask;  // larger jobs run in slices of this many tasks

struct Pool {
  std::vector<std::thread> workers;
  std::atomic<uint64_t> generation{0};  // bumped per job: wakes workers
  std::atomic<uint64_t> ticket{0};
  std::atomic<int64_t> done{0};
  std::atomic<int> sleeping{0};
  std::atomic<bool> stop{false};
  uint64_t job = 0;
  TaskFn fn = nullptr;
  void* ctx = nullptr;
  std::mutex mu;
  std::condition_variable cv;
  std::mutex run_mu;  // one job at a time (calls from several Python threads queue here)
  // join profiling (pool_profile_join): per thread (0 = the caller, i = worker i), when its last task of
  // the current job ended (0: none yet)
  std::atomic<bool> prof{false};
  std::atomic<uint64_t> idle_ticks{0};
  std::vector<std::atomic<uint64_t>> last_end = std::vector<std::atomic<uint64_t>>(kMaxThreads);
  // the next run's weights (NextPrefetch), set by the caller before a run and cleared after it
  std::atomic<const char*> pf_start[NextPrefetch::kMax] = {};
  std::atomic<int> pf_n{0};
  std::atomic<int64_t> pf_bytes{0};

  // A thread's share of the next run's hint (NextPrefetch): taken when it sees the run start (the hint is
  // published with the ticket), issued while it waits (idle_prefetch_some), so a new run or the end of the
  // current one interrupts it within one slice.
  struct Cursor {
    const char* p = nullptr;
    int64_t off = 0, bytes = 0;
    bool busy() const { return off < bytes; }
  };
  Cursor take_hint(int tid) {
    Cursor c;
    const int n = pf_n.load(std::memory_order_relaxed);
    if (n <= 0) return c;
    c.p = pf_start[tid % n].load(std::memory_order_relaxed);
    c.bytes = c.p ? pf_bytes.load(std::memory_order_relaxed) : 0;
    return c;
  }
  static void idle_prefetch_some(Cursor& c) {
    const int64_t end = std::min(c.bytes, c.off + kPrefetchSlice);
    for (; c.off < end; c.off += 64) __builtin_prefetch(c.p + c.off, 0, 2);  // into L2
  }

  static uint64_t pack(uint64_t job, uint64_t n, uint64_t i) {
    return (job << (2 * kIdxBits)) | (n << kIdxBits) | i;
  }

  bool claim(uint64_t job_id, int64_t& idx) {
    uint64_t v = ticket.load(std::memory_order_acquire);
    for (;;) {
      if ((v >> (2 * kIdxBits)) != job_id) return false;
      const uint64_t n = (v >> kIdxBits) & kIdxMask, i = v & kIdxMask;
      if (i >= n) return false;
      if (ticket.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        idx = (int64_t)i;
        return true;
      }
    }
  }

  // Returns how many tasks this thread ran.
  int64_t drain(uint64_t job_id, int tid) {
    int64_t ran = 0;
    for (int64_t t; claim(job_id, t);) {
      fn(ctx, t);
      if (prof.load(std::memory_order_relaxed)) last_end[tid].store(cycle_ticks(), std::memory_order_relaxed);
      done.fetch_add(1, std::memory_order_acq_rel);
      ++ran;
    }
    return ran;
  }

  // `seen` is the generation at creation: a job (or stop) posted before the thread first runs is not missed.
  void worker_loop(uint64_t seen, int tid) {
    Cursor pf;
    for (;;) {
      uint64_t g;
      int spins = 0;
      auto idle_since = Clock::now();
      while ((g = generation.load(std::memory_order_acquire)) == seen) {
        if (pf.busy()) {
          idle_prefetch_some(pf);
          continue;
        }
        ++spins;
        if (spins < kPauseIters) LOWBIT_PAUSE();
        else std::this_thread::yield();
        if ((spins & 63) != 0 || Clock::now() - idle_since < kSpinTime) continue;
        std::unique_lock<std::mutex> lock(mu);
        sleeping.fetch_add(1);
        cv.wait(lock, [&] { return generation.load() != seen; });
        sleeping.fetch_sub(1);
        spins = 0;
        idle_since = Clock::now();
      }
      seen = g;
      if (stop.load()) return;
      pf = take_hint(tid);
      drain(ticket.load(std::memory_order_acquire) >> (2 * kIdxBits), tid);
    }
  }

  void start(int n) {
    shutdown();
    stop.store(false);
    const uint64_t g = generation.load();
    for (int i = 0; i < n - 1; ++i) workers.emplace_back([this, g, i] { worker_loop(g, i + 1); });
  }

  void shutdown() {
    if (workers.empty()) return;
    stop.store(true);
    generation.fetch_add(1);
    { std::lock_guard<std::mutex> lock(mu); cv.notify_all(); }
    for (auto& w : workers) w.join();
    workers.clear();
  }

  void run_slice(int64_t n, TaskFn f, void* c) {
    fn = f;
    ctx = c;
    const bool profiling = prof.load(std::memory_order_relaxed);
    const int nthreads = (int)workers.size() + 1;
    uint64_t t0 = 0;
    if (profiling) {
      for (int i = 0; i < nthreads; ++i) last_end[i].store(0, std::memory_order_relaxed);
      t0 = cycle_ticks();
    }
    done.store(0, std::memory_order_relaxed);
    job = (job + 1) & ((uint64_t(1) << (64 - 2 * kIdxBits)) - 1);
    ticket.store(pack(job, (uint64_t)n, 0), std::memory_order_release);
    generation.fetch_add(1);  // seq_cst: pairs with the sleeping counter (no lost wake-up)
    if (sleeping.load() > 0) { std::lock_guard<std::mutex> lock(mu); cv.notify_all(); }
    Cursor pf = take_hint(0);
    drain(job, 0);
    for (int spins = 0; done.load(std::memory_order_acquire) < n; ++spins) {
      if (pf.busy()) {
        idle_prefetch_some(pf);
        continue;
      }
      if (spins < kPauseIters) LOWBIT_PAUSE();
      else std::this_thread::yield();
    }
    if (profiling) {
      const uint64_t t1 = cycle_ticks();
      uint64_t idle = 0;
      for (int i = 0; i < nthreads; ++i) {
        const uint64_t e = last_end[i].load(std::memory_order_relaxed);
        idle += t1 - (e ? std::min(e, t1) : t0);
      }
      idle_ticks.fetch_add(idle / nthreads, std::memory_order_relaxed);
    }
  }

  void run(int64_t n, TaskFn f, void* c, int threads, const NextPrefetch* next) {
    std::lock_guard<std::mutex> guard(run_mu);
    if ((int)workers.size() != threads - 1) start(threads);  // first use, or the first use after fork()
    if (workers.empty() || n <= 1) {
      for (int64_t t = 0; t < n; ++t) f(c, t);
      return;
    }
    struct ClearNext {  // the hint holds for this run only
      Pool* p;
      ~ClearNext() { p->pf_n.store(0, std::memory_order_relaxed); }
    } clear{this};
    if (next && next->n > 0) {
      const int m = std::min(next->n, NextPrefetch::kMax);
      for (int i = 0; i < m; ++i) pf_start[i].store(next->starts[i], std::memory_order_relaxed);
      pf_bytes.store(next->bytes, std::memory_order_relaxed);
      pf_n.store(m, std::memory_order_relaxed);  // published to the workers with the ticket (release)
    }
    struct Slice { TaskFn f; void* c; int64_t base; };
    for (int64_t base = 0; base < n; base += kMaxTasks) {
      Slice sl{f, c, base};
      run_slice(std::min(kMaxTasks, n - base),
                [](void* p, int64_t t) { auto* s = static_cast<Slice*>(p); s->f(s->c, s->base + t); }, &sl);
    }
  }
};

// The pool lives on the heap and is never destroyed: at exit its workers may still be parked in it, and
// after fork() the child abandons the parent's (its threads do not exist there) and makes a new one.
std::atomic<Pool*> g_pool{nullptr};
std::atomic<int> g_threads{1};
std::mutex g_pool_init;

void before_fork() {
  settings_mutex().lock();  // no kernel runs while the address space is copied
  g_pool.load()->run_mu.lock();
}
void after_fork_parent() {
  g_pool.load()->run_mu.unlock();
  settings_mutex().unlock();
}
void after_fork_child() {
  // The parent's workers do not exist here: leak their pool (joining or destroying their std::thread
  // objects would abort) and let the first pool_run start this process's own workers.
  g_pool.store(new Pool());
  settings_mutex_renew_in_child();
}

Pool& pool() {
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p) return *p;
  std::lock_guard<std::mutex> lock(g_pool_init);
  if (!g_pool.load()) {
    g_pool.store(new Pool());
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
  }
  return *g_pool.load();
}

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

std::vector<int> affinity_list() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int i = 0; i < CPU_SETSIZE; ++i)
      if (CPU_ISSET(i, &set)) cpus.push_back(i);
  if (cpus.empty()) {
    const int n = std::max(1u, std::thread::hardware_concurrency());
    for (int i = 0; i < n; ++i) cpus.push_back(i);
  }
  return cpus;
}

// quota / period of one cgroup directory, or <= 0 if it sets none.
double dir_limit(const std::string& dir) {
  std::istringstream v2(read_line(dir + "/cpu.max"));  // "max 100000" or "200000 100000"
  std::string q;
  double period = 0;
  if (v2 >> q >> period) return q == "max" || period <= 0 ? 0 : std::atof(q.c_str()) / period;
  const std::string q1 = read_line(dir + "/cpu.cfs_quota_us"), p1 = read_line(dir + "/cpu.cfs_period_us");
  if (q1.empty() || p1.empty()) return 0;
  const double quota = std::atof(q1.c_str()), per = std::atof(p1.c_str());
  return quota > 0 && per > 0 ? quota / per : 0;
}

// The tightest limit from `dir` up to `mount` (a quota on a parent cgroup binds its children too).
double path_limit(const std::string& mount, std::string rel) {
  double best = 0;
  for (;;) {
    const double l = dir_limit(mount + rel);
    if (l > 0 && (best <= 0 || l < best)) best = l;
    if (rel.empty() || rel == "/") break;
    rel = rel.substr(0, rel.find_last_of('/'));
  }
  return best;
}

}  // namespace

double cgroup_cpu_limit(const std::string& root, const std::string& self_cgroup) {
  std::ifstream f(self_cgroup);
  std::string line;
  double best = 0;
  auto take = [&](double l) { if (l > 0 && (best <= 0 || l < best)) best = l; };
  while (std::getline(f, line)) {
    // "hierarchy-id:controllers:path"; v2 is "0::/path"
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string ctrls = line.substr(a + 1, b - a - 1);
    std::string rel = line.substr(b + 1);
    if (rel == "/") rel = "";
    if (ctrls.empty()) {
      take(path_limit(root, rel));
      continue;
    }
    std::istringstream ss(ctrls);
    bool cpu = false;
    for (std::string c; std::getline(ss, c, ',');) cpu |= c == "cpu";
    if (!cpu) continue;
    for (const std::string& m : {root + "/" + ctrls, root + "/cpu", root + "/cpu,cpuacct"}) {
      take(path_limit(m, rel));
      take(path_limit(m, ""));  // in a container the cgroup path is not visible below the mount
    }
  }
  return best;
}

int affinity_cpus() { return (int)affinity_list().size(); }

int physical_cores() {
  std::set<std::pair<std::string, std::string>> cores;
  const std::vector<int> cpus = affinity_list();
  for (int c : cpus) {
    const std::string t = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    const std::string core = read_line(t + "core_id");
    if (core.empty()) return (int)cpus.size();
    cores.insert({read_line(t + "physical_package_id"), core});
  }
  return std::max<int>(1, (int)cores.size());
}

int default_threads() {
  int n = physical_cores();
  const double quota = cgroup_cpu_limit();
  if (quota > 0) n = std::min(n, (int)std::ceil(quota - 1e-9));
  return std::max(1, std::min(n, kMaxThreads));
}

void pool_set_threads(int n) {
  n = std::max(1, std::min(n, kMaxThreads));
  Pool& p = pool();
  std::lock_guard<std::mutex> guard(p.run_mu);
  p.start(n);
  g_threads.store(n);
}

int pool_threads() { return g_threads.load(std::memory_order_relaxed); }

int pool_sleeping() { return pool().sleeping.load(); }

void pool_run(int64_t ntasks, TaskFn fn, void* ctx) { pool().run(ntasks, fn, ctx, g_threads.load(), nullptr); }

void pool_run_rows(int64_t n, TaskFn fn, void* ctx) {
  struct Rows {
    TaskFn fn;
    void* ctx;
    int64_t n, per;
  } rows{fn, ctx, n, std::max<int64_t>(1, n / (4 * (int64_t)pool_threads()))};
  pool_run((n + rows.per - 1) / rows.per, [](void* p, int64_t t) {
    const Rows& c = *static_cast<const Rows*>(p);
    for (int64_t r = t * c.per; r < std::min(c.n, (t + 1) * c.per); ++r) c.fn(c.ctx, r);
  }, &rows);
}

void pool_run(int64_t ntasks, TaskFn fn, void* ctx, const NextPrefetch* next) {
  pool().run(ntasks, fn, ctx, g_threads.load(), next);
}

uint64_t cycle_ticks() {
#if defined(__x86_64__) || defined(_M_X64)
  return __rdtsc();
#else
  return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
#endif
}

void pool_profile_join(bool on) { pool().prof.store(on, std::memory_order_relaxed); }

uint64_t pool_join_idle_ticks() { return pool().idle_ticks.load(std::memory_order_relaxed); }

}  // namespace lowbit
