"""Process trees shaped like real engines, on the fake torch + fake CUPTI (tests only).

    python -m fake_engine vllm N       API server (no CUDA) -> EngineCore (spawn) -> N workers (spawn,
                                       local rank as an argument, torch.distributed initialised)
    python -m fake_engine sglang N     main -> one scheduler per rank (spawn) + a detokenizer (no graphs)
    python -m fake_engine torchrun N   launcher -> N workers with LOCAL_RANK/RANK in the environment
    python -m fake_engine plain N M    parent starts N graph workers with start method M, no LOCAL_RANK
    python -m fake_engine sequence     rank 0 restarted: worker v1 until the file FAKE_V1_STOP exists,
                                       then v2 in its place, another build: each FAKE_V2_<KNOB> is v2's
                                       FAKE_<KNOB> (torch/cuda/graphs.py), e.g. FAKE_V2_EXTRA_GAP_NS

Workers replay their graph every 2 ms until the file named by FAKE_STOP exists (or 60 s).
"""
import multiprocessing as mp
import os
import subprocess
import sys
import time


def _stopped():
    p = os.environ.get("FAKE_STOP", "")
    return bool(p) and os.path.exists(p)


def _replay_loop():
    import torch

    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        pass
    t_end = time.monotonic() + 60
    while not _stopped() and time.monotonic() < t_end:
        g.replay()
        time.sleep(0.002)


def _idle_loop():
    t_end = time.monotonic() + 60
    while not _stopped() and time.monotonic() < t_end:
        time.sleep(0.02)


def worker(local_rank, dist=True):
    import torch

    torch.cuda.set_device(local_rank)
    if dist:
        torch.distributed.init_process_group(rank=local_rank, world_size=2)
    _replay_loop()


def no_graph_process():
    import torch  # noqa: F401  (a tokenizer/detokenizer: torch imported, no graph)

    _idle_loop()


def engine_core(n):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(r,)) for r in range(n)]
    for p in procs:
        p.start()
    _idle_loop()
    for p in procs:
        p.join()


def _run_children(procs):
    for p in procs:
        p.start()
    for p in procs:
        p.join()


def main(argv):
    shape, n = argv[0], int(argv[1]) if len(argv) > 1 else 2
    if shape == "vllm":
        import torch  # noqa: F401  (the API server imports torch, never captures)

        _run_children([mp.get_context("spawn").Process(target=engine_core, args=(n,))])
    elif shape == "sglang":
        ctx = mp.get_context("spawn")
        _run_children([ctx.Process(target=worker, args=(r,)) for r in range(n)] + [ctx.Process(target=no_graph_process)])
    elif shape in ("torchrun", "launcher"):
        procs = []
        for r in range(n):
            env = dict(os.environ, LOCAL_RANK=str(r), RANK=str(r), WORLD_SIZE=str(n))
            procs.append(subprocess.Popen([sys.executable, "-m", "fake_engine", "env_worker"], env=env))
        for p in procs:
            p.wait()
    elif shape == "env_worker":
        import torch

        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        _replay_loop()
    elif shape == "sequence":
        v2 = {"FAKE_" + k.removeprefix("FAKE_V2_"): v for k, v in os.environ.items() if k.startswith("FAKE_V2_")}
        for version in ("1", "2"):
            env = dict(os.environ, LOCAL_RANK="0", RANK="0", WORLD_SIZE="1")
            if version == "1":
                env["FAKE_STOP"] = os.environ["FAKE_V1_STOP"]
            else:
                env.update(v2)
            subprocess.Popen([sys.executable, "-m", "fake_engine", "env_worker"], env=env).wait()
    elif shape == "plain":
        ctx = mp.get_context(argv[2] if len(argv) > 2 else "spawn")
        _run_children([ctx.Process(target=worker, args=(r, False)) for r in range(n)])
    else:
        raise SystemExit(f"unknown shape {shape}")


if __name__ == "__main__":
    main(sys.argv[1:])
