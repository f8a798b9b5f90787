"""bench/deploy/first_data.py's mark in the GPU workloads: the time their compiled graphs replay steadily."""
import os
import time

STEADY_ENV = "GRAPHMON_BENCH_STEADY_FILE"  # set by bench/deploy/first_data.py; the workloads then skip their profiler phase


def mark_steady() -> bool:
    """Write time.time() to $GRAPHMON_BENCH_STEADY_FILE once (the first writer wins). Returns
    whether this run is such a benchmark run."""
    path = os.environ.get(STEADY_ENV)
    if path and not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as fh:
            fh.write(repr(time.time()))
        try:
            os.link(tmp, path)  # whole and exclusive: a reader never sees half, a second writer loses
        except FileExistsError:
            pass
        os.unlink(tmp)
    return bool(path)
