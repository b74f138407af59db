"""Timing a model's calls: the one clock every measurement in optbuild uses, the benchmark
step's and `optbuild bench`'s alike (time.perf_counter_ns per call, the garbage collector off
while timing, as in ``timeit``), the latency figures made of it, and the host's load as they
were taken (a measurement is a fact about a moment: both record it beside their figures).
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def blocks(total: int, rounds: int) -> list[int]:
    """``total`` runs split into ``rounds`` blocks as even as can be (interleaved models take
    turns by block, so that drift on a shared host hits them all alike)."""
    rounds = max(1, min(rounds, total))
    return [total // rounds + (1 if i < total % rounds else 0) for i in range(rounds)]


@contextmanager
def gc_off() -> Iterator[None]:
    """The garbage collector off while timing, as in ``timeit``."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def time_calls(call: Callable[[], Any], runs: int, warmup: int = 0) -> list[int]:
    """``warmup`` untimed calls of ``call``, then the time of each of ``runs`` calls, in
    nanoseconds (time.perf_counter_ns), the garbage collector off while timing. What the
    benchmark step measures; ``measure`` interleaves several models the same way. ``call``
    returns when its work is done, on a GPU too (``Runner.timed_call``: onnxruntime's
    run_with_iobinding synchronizes the device), so a host clock times the device."""
    for _ in range(warmup):
        call()
    clock = time.perf_counter_ns
    times = []
    with gc_off():
        for _ in range(runs):
            started = clock()
            call()
            times.append(clock() - started)
    return times


def latency_figures(times_ns: list[int]) -> dict[str, float]:
    """Latency figures in ms of the timed runs ``times_ns``: p50, p90, p99, mean, min, max, std."""
    import numpy as np

    ms = np.asarray(times_ns, dtype=np.float64) / 1e6
    p50, p90, p99 = (float(v) for v in np.percentile(ms, [50, 90, 99]))
    return {"p50": p50, "p90": p90, "p99": p99, "mean": float(ms.mean()),
            "min": float(ms.min()), "max": float(ms.max()), "std": float(ms.std())}


def host_load() -> dict[str, Any]:
    """The load as measuring begins: the 1-minute load average (None where the system keeps
    none, as Windows) and the CPU count, so that a figure taken beside other work can be told."""
    try:
        average: float | None = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        average = None
    return {"load_average": average, "cpu_count": os.cpu_count() or 1}


@contextmanager
def watch_load() -> Iterator[dict[str, Any]]:
    """``host_load()`` as measuring begins, completed as it ends with ``others_cpu``: the share
    of the host's CPU time that other processes took meanwhile (0.5: one of 2 CPUs), from the
    kernel's CPU counters less this process's own use (and its reaped children's); None where
    there are no such counters (not Linux). The load average lags a minute behind: as a select
    step begins it still counts the steps that built before it, while this says what competed
    with the timed runs themselves."""
    load = host_load()
    before = _cpu_seconds()
    try:
        yield load
    finally:
        after = _cpu_seconds()
        load["others_cpu"] = None
        if before is not None and after is not None and after[2] > before[2]:
            others = (after[0] - before[0]) - (after[1] - before[1])
            load["others_cpu"] = round(min(1.0, max(0.0, others / ((after[2] - before[2]) * load["cpu_count"]))), 3)


def _cpu_seconds() -> tuple[float, float, float] | None:
    """(CPU seconds the host spent busy, this process's own and its reaped children's, the
    monotonic clock), or None without /proc/stat."""
    import resource

    try:
        with open("/proc/stat", "rb") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != b"cpu":
        return None
    # user nice system idle iowait irq softirq steal (guest time is inside user already)
    ticks = [int(v) for v in fields[1:9]]
    busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    own = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for f in ("ru_utime", "ru_stime"))
    return busy, own, time.monotonic()


# Other processes taking more than this share of the CPUs while measuring make figures noisy.
BUSY_SHARE = 0.10


def busy_note(load: dict[str, Any]) -> str | None:
    """What to tell the user when other work competed with the measurement: other processes
    took more than BUSY_SHARE of the CPUs meanwhile (``watch_load``), or, where that is not
    known, the load average exceeded the CPUs as measuring began; None otherwise."""
    cpus, others = load["cpu_count"], load.get("others_cpu")
    if others is not None:
        if others <= BUSY_SHARE:
            return None
        return (f"other processes took {others:.0%} of the {cpus} CPUs while measuring: they competed with "
                "the timed runs, expect noisy figures")
    average = load["load_average"]
    if average is None or average <= cpus:
        return None
    return (f"load average {average:.2f} on {cpus} CPUs as measuring began: other work competes for the "
            "CPUs, expect noisy figures")
