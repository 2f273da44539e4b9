"""Timing shared by the benchmark scripts (imported from benchmarks/, their own folder)."""
import statistics
import time


def median_s(f, n=15):
    """Median seconds of n calls of f(), after one untimed call (caches, allocations)."""
    f()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
