// One persistent pool of worker threads. Work is a count of tasks handed out dynamically through an
// atomic counter, so a core that is slower (hybrid CPUs, a shared machine) simply takes fewer tasks.
// Workers spin briefly after a job (decode calls come every few microseconds), then sleep.
#pragma once
#include <cstdint>

namespace lowbit {

using TaskFn = void (*)(void* ctx, int64_t task);

void pool_set_threads(int n);   // n >= 1; the caller is one of them
int pool_threads();
// Runs fn(ctx, t) for t in [0, ntasks) on the pool and the calling thread; returns when all are done.
void pool_run(int64_t ntasks, TaskFn fn, void* ctx);
int physical_cores();

}  // namespace lowbit
