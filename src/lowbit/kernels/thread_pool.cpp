#include "thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define LOWBIT_PAUSE() _mm_pause()
#else
#define LOWBIT_PAUSE() ((void)0)
#endif

namespace lowbit {
namespace {

constexpr int kSpinIters = 1 << 16;   // ~100-200 us of spinning before a worker sleeps
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

  void drain(uint64_t job_id) {
    for (int64_t t; claim(job_id, t);) {
      fn(ctx, t);
      done.fetch_add(1, std::memory_order_acq_rel);
    }
  }

  // `seen` is the generation at creation: a job (or stop) posted before the thread first runs is not missed.
  void worker_loop(uint64_t seen) {
    for (;;) {
      uint64_t g;
      int spins = 0;
      while ((g = generation.load(std::memory_order_acquire)) == seen) {
        if (++spins < kSpinIters) {
          if (spins < kPauseIters) LOWBIT_PAUSE();
          else std::this_thread::yield();
          continue;
        }
        std::unique_lock<std::mutex> lock(mu);
        sleeping.fetch_add(1);
        cv.wait(lock, [&] { return generation.load() != seen; });
        sleeping.fetch_sub(1);
      }
      seen = g;
      if (stop.load()) return;
      drain(ticket.load(std::memory_order_acquire) >> (2 * kIdxBits));
    }
  }

  void start(int n) {
    shutdown();
    stop.store(false);
    const uint64_t g = generation.load();
    for (int i = 0; i < n - 1; ++i) workers.emplace_back([this, g] { worker_loop(g); });
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
    done.store(0, std::memory_order_relaxed);
    job = (job + 1) & ((uint64_t(1) << (64 - 2 * kIdxBits)) - 1);
    ticket.store(pack(job, (uint64_t)n, 0), std::memory_order_release);
    generation.fetch_add(1);  // seq_cst: pairs with the sleeping counter (no lost wake-up)
    if (sleeping.load() > 0) { std::lock_guard<std::mutex> lock(mu); cv.notify_all(); }
    drain(job);
    for (int spins = 0; done.load(std::memory_order_acquire) < n; ++spins) {
      if (spins < kPauseIters) LOWBIT_PAUSE();
      else std::this_thread::yield();
    }
  }

  void run(int64_t n, TaskFn f, void* c) {
    std::lock_guard<std::mutex> guard(run_mu);
    if (workers.empty() || n <= 1) {
      for (int64_t t = 0; t < n; ++t) f(c, t);
      return;
    }
    struct Slice { TaskFn f; void* c; int64_t base; };
    for (int64_t base = 0; base < n; base += kMaxTasks) {
      Slice sl{f, c, base};
      run_slice(std::min(kMaxTasks, n - base),
                [](void* p, int64_t t) { auto* s = static_cast<Slice*>(p); s->f(s->c, s->base + t); }, &sl);
    }
  }

  ~Pool() { shutdown(); }
};

Pool& pool() {
  static Pool p;
  return p;
}
int g_threads = 1;

}  // namespace

int physical_cores() {
  // Distinct (physical id, core id) pairs; SMT siblings count once.
  std::ifstream f("/proc/cpuinfo");
  std::set<std::pair<std::string, std::string>> cores;
  std::string line, phys = "0";
  while (std::getline(f, line)) {
    auto val = [&] { auto p = line.find(':'); return p == std::string::npos ? std::string() : line.substr(p + 2); };
    if (line.rfind("physical id", 0) == 0) phys = val();
    else if (line.rfind("core id", 0) == 0) cores.insert({phys, val()});
  }
  int n = (int)cores.size();
  if (n <= 0) n = (int)std::thread::hardware_concurrency();
  return n > 0 ? n : 1;
}

void pool_set_threads(int n) {
  if (n < 1) n = 1;
  std::lock_guard<std::mutex> guard(pool().run_mu);
  pool().start(n);
  g_threads = n;
}

int pool_threads() { return g_threads; }

void pool_run(int64_t ntasks, TaskFn fn, void* ctx) { pool().run(ntasks, fn, ctx); }

}  // namespace lowbit
