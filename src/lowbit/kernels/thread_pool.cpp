#include "thread_pool.h"

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

struct Pool {
  std::vector<std::thread> workers;
  std::atomic<uint64_t> generation{0};
  std::atomic<int> sleeping{0};
  std::atomic<int> active{0};
  std::atomic<int64_t> next{0};
  std::atomic<bool> stop{false};
  int64_t ntasks = 0;
  TaskFn fn = nullptr;
  void* ctx = nullptr;
  std::mutex mu;
  std::condition_variable cv;
  std::mutex run_mu;  // one job at a time (calls from several Python threads queue here)

  void drain() {
    for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < ntasks;) fn(ctx, t);
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
      drain();
      active.fetch_sub(1, std::memory_order_acq_rel);
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

  void run(int64_t n, TaskFn f, void* c) {
    std::lock_guard<std::mutex> guard(run_mu);
    if (workers.empty() || n <= 1) {
      for (int64_t t = 0; t < n; ++t) f(c, t);
      return;
    }
    fn = f; ctx = c; ntasks = n;
    next.store(0, std::memory_order_relaxed);
    active.store((int)workers.size(), std::memory_order_relaxed);
    generation.fetch_add(1);  // seq_cst: pairs with the sleeping counter (no lost wake-up)
    if (sleeping.load() > 0) { std::lock_guard<std::mutex> lock(mu); cv.notify_all(); }
    drain();
    for (int spins = 0; active.load(std::memory_order_acquire) > 0; ++spins) {
      if (spins < kPauseIters) LOWBIT_PAUSE();
      else std::this_thread::yield();
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
