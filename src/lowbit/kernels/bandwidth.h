#pragma once
#include <cstdint>

namespace lowbit {

// Reads buf [0, bytes) `passes` times on the thread pool (tasks of 256 KiB handed out dynamically),
// with the same software prefetch distance as the GEMV kernels. Returns elapsed seconds.
double read_bandwidth(const uint8_t* buf, int64_t bytes, int passes);
// Seconds per pool_run() with one empty task per thread, averaged over `iters`: the fork/join cost.
double pool_overhead(int iters);

}  // namespace lowbit
