"""The thread pool and the settings around it: default size from affinity and cgroup quota, idle workers
asleep within about a millisecond (an idle process burns ~0 CPU), fork() safety, set_isa / set_threads
waiting for running kernels, CPUID executed once."""
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import lowbit
from lowbit import _native
from lowbit.formats import quantize
from lowbit.formats.base import Activations


def run_py(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env={k: v for k, v in os.environ.items() if k != "LOWBIT_THREADS"})


def test_default_threads_follow_the_affinity_mask():
    cpu = sorted(os.sched_getaffinity(0))[0]
    r = run_py(f"""
        import os
        os.sched_setaffinity(0, {{{cpu}}})
        import lowbit
        i = lowbit.cpu_info()
        print(lowbit.get_threads(), i["affinity_cpus"], i["physical_cores"], i["default_threads"])
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "1", "1", "1"]


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_quota_tightest_along_the_path(tmp_path):
    self_cg = tmp_path / "self_cgroup"
    write(self_cg, "0::/a/b\n")
    root = tmp_path / "cg"
    write(root / "a/b/cpu.max", "150000 100000\n")
    write(root / "a/cpu.max", "max 100000\n")
    assert _native.cgroup_cpu_limit(str(root), str(self_cg)) == pytest.approx(1.5)
    write(root / "a/cpu.max", "50000 100000\n")  # a parent's quota binds its children
    assert _native.cgroup_cpu_limit(str(root), str(self_cg)) == pytest.approx(0.5)
    write(root / "a/cpu.max", "max 100000\n")
    write(root / "a/b/cpu.max", "max 100000\n")
    assert _native.cgroup_cpu_limit(str(root), str(self_cg)) <= 0  # no quota


def test_cgroup_v1_quota(tmp_path):
    self_cg = tmp_path / "self_cgroup"
    write(self_cg, "5:memory:/m\n3:cpu,cpuacct:/x\n0::/\n")
    root = tmp_path / "cg"
    write(root / "cpu,cpuacct/x/cpu.cfs_quota_us", "200000\n")
    write(root / "cpu,cpuacct/x/cpu.cfs_period_us", "100000\n")
    assert _native.cgroup_cpu_limit(str(root), str(self_cg)) == pytest.approx(2.0)
    write(root / "cpu,cpuacct/x/cpu.cfs_quota_us", "-1\n")
    assert _native.cgroup_cpu_limit(str(root), str(self_cg)) <= 0
    assert _native.cgroup_cpu_limit(str(tmp_path / "missing"), str(tmp_path / "missing")) <= 0


def test_default_threads_within_affinity_and_quota():
    i = lowbit.cpu_info()
    assert 1 <= i["default_threads"] <= i["physical_cores"] <= i["affinity_cpus"] <= len(os.sched_getaffinity(0))
    if i["cgroup_cpu_quota"] > 0:
        assert i["default_threads"] <= max(1, -(-i["cgroup_cpu_quota"] // 1))


def cpu_seconds() -> float:
    t = os.times()  # the whole process: every thread
    return t.user + t.system


def test_idle_workers_sleep_and_an_idle_process_burns_no_cpu():
    """After a generation the workers park after 0.5 ms of spinning (the wall-clock bound is 1 s: on an
    oversubscribed machine a spinning worker may wait that long to be scheduled and see its deadline);
    the process then uses < 30 ms of CPU over 1 s of idleness (it measured 0-10 ms here, one clock tick)."""
    from lowbit.generate import generate
    from tests.model.tiny import ByteTokenizer, tiny_model

    before = lowbit.get_threads()
    try:
        lowbit.set_threads(3)  # two workers, even on a 2-core machine
        model = tiny_model(format="int4")
        generate(model, ByteTokenizer(), "hello", max_tokens=16)
        t0 = time.perf_counter()
        while _native.pool_sleeping() < 2 and time.perf_counter() - t0 < 5.0:
            time.sleep(0.0005)
        parked_after = time.perf_counter() - t0
        assert _native.pool_sleeping() == 2
        assert parked_after < 1.0, parked_after
        c0, w0 = cpu_seconds(), time.perf_counter()
        time.sleep(1.0)
        used, wall = cpu_seconds() - c0, time.perf_counter() - w0
        print(f"idle: workers parked {parked_after * 1e3:.2f} ms after the generation; "
              f"{used * 1e3:.1f} ms CPU over {wall:.2f} s idle")
        assert used < 0.03, used
    finally:
        lowbit.set_threads(before)


FORK_SCRIPT = """
    import multiprocessing as mp, os, sys
    import numpy as np
    import lowbit
    from lowbit.formats import quantize

    lowbit.set_threads(3)
    rng = np.random.default_rng(0)
    w = quantize(rng.standard_normal((300, 256)).astype(np.float32), "int4")
    x = rng.standard_normal((2, 256)).astype(np.float32)
    want = w.matmul(x)  # the parent's pool is running

    def work(_):
        return float(np.abs(w.matmul(x) - want).max())

    pid = os.fork()
    if pid == 0:  # the child: the parent's workers do not exist here
        ok = np.array_equal(w.matmul(x), want) and lowbit.get_threads() == 3
        sys.stdout.flush()
        sys.exit(0 if ok else 3)  # a normal exit: static destructors must not join absent threads
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    with mp.get_context("fork").Pool(2) as p:
        errs = p.map(work, range(4))
    assert errs == [0.0] * 4, errs
    assert np.array_equal(w.matmul(x), want)  # and the parent's pool still works
    print("fork ok")
"""


def test_pool_survives_fork():
    r = run_py(FORK_SCRIPT, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fork ok" in r.stdout


def test_set_isa_and_set_threads_wait_for_running_kernels():
    """A long kernel runs in one thread; set_isa / set_threads from another return only after it ended."""
    rng = np.random.default_rng(0)
    pw = quantize(rng.standard_normal((2048, 1024)).astype(np.float32), "int4")
    x = rng.standard_normal((1, 1024)).astype(np.float32)
    q, sx, sq = Activations(x).int8(pw.kp, pw.group)
    y = np.zeros((1, 2048), np.float32)
    copy = (pw.codes, pw._scale_u16, pw._offset_u16)
    _native.bench_int([copy], float(pw.zc or 0.0), 4, 2048, pw.kp, pw.group, q, sx, sq, y, 200)  # warm-up
    per_call = _native.bench_int([copy], float(pw.zc or 0.0), 4, 2048, pw.kp, pw.group, q, sx, sq, y, 200) / 200
    iters = max(200, int(0.8 / max(per_call, 1e-6)))  # ~0.8 s of kernels in one native call
    before_isa, before_threads = _native.isa(), lowbit.get_threads()
    # each change must really change the setting: asking for the value in force returns at once (nothing to wait for)
    other_isa = "scalar" if before_isa != "scalar" else next(i for i in lowbit.cpu_info()["available"] if i != "scalar")
    other_threads = 1 if before_threads != 1 else 2
    for change in (lambda: lowbit.set_isa(other_isa), lambda: lowbit.set_threads(other_threads)):
        for attempt in range(4):  # a loaded machine may finish the kernel before the change is even tried
            span = {}

            def bench():
                span["start"] = time.perf_counter()
                span["secs"] = _native.bench_int([copy], float(pw.zc or 0.0), 4, 2048, pw.kp, pw.group, q, sx, sq, y,
                                                 iters)

            t = threading.Thread(target=bench)
            t.start()
            time.sleep(0.1)
            called = time.perf_counter()
            change()
            returned = time.perf_counter()
            t.join()
            lowbit.set_isa(before_isa)
            lowbit.set_threads(before_threads)
            kernel_end = span["start"] + span["secs"]
            if called < kernel_end - 0.02:  # the change was tried while the kernel ran: it must have waited
                assert returned >= kernel_end - 0.005, (
                    f"the setting changed {1e3 * (kernel_end - returned):.1f} ms before the kernel ended")
                break
            iters *= 2
        else:
            pytest.fail("could not start the change while a kernel was running")
    np.testing.assert_allclose(y, pw.matmul(x), rtol=1e-5, atol=1e-5)  # the runs were not disturbed


def test_no_cpuid_on_the_hot_path():
    """CPUID runs once per process (cpu_features() caches it); kernels, the decoder and set_isa reuse it."""
    from tests.model.tiny import tiny_model

    n0 = _native.cpuid_queries()
    assert n0 == 1
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 100)).astype(np.float32)
    for isa in _native.cpu_info()["available"]:
        lowbit.set_isa(isa)
        for fmt in ("int4", "tq1", "bf16"):
            quantize(rng.standard_normal((70, 100)).astype(np.float32), fmt).matmul(x)
        m = tiny_model(format="ternary")
        m.prefill([1, 2, 3])
        m.decode(4)
    lowbit.set_isa("auto")
    assert _native.cpuid_queries() == n0
