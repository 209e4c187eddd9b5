#include "bandwidth.h"


#include <algorithm>
#include <atomic>
#include <chrono>

#include "dispatch.h"
#include "thread_pool.h"

namespace lowbit {
namespace {

constexpr int64_t kTask = 256 * 1024;
std::atomic<uint64_t> g_sink{0};

struct ReadCtx {
  const uint8_t* buf;
  int64_t bytes;
  const KernelTable* k;
};

void read_task(void* p, int64_t t) {
  const ReadCtx& c = *static_cast<const ReadCtx*>(p);
  const int64_t n = std::min<int64_t>(kTask, c.bytes - t * kTask) / 256 * 256;
  g_sink.fetch_add(c.k->read(c.buf + t * kTask, n), std::memory_order_relaxed);
}

void empty_task(void*, int64_t) {}

}  // namespace

double read_bandwidth(const uint8_t* buf, int64_t bytes, int passes) {
  ReadCtx c{buf, bytes, &active_kernels()};
  const int64_t ntasks = (bytes + kTask - 1) / kTask;
  const auto t0 = std::chrono::steady_clock::now();
  for (int p = 0; p < passes; ++p) pool_run(ntasks, read_task, &c);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double pool_overhead(int iters) {
  const int n = pool_threads();
  for (int i = 0; i < 100; ++i) pool_run(n, empty_task, nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) pool_run(n, empty_task, nullptr);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
}

}  // namespace lowbit
