"""A vLLM-shaped process tree (run by test_vllm_shaped.py under `graphmon run`): an API-server
process without CUDA spawns an EngineCore process, which spawns one worker per GPU (up to 2) with
the local rank as an argument (multiprocessing spawn, no LOCAL_RANK). Each worker runs a
torch.compile(mode="reduce-overhead") decode step (cudagraph trees) until argv[2] exists, then
detaches graphmon and writes a torch.profiler trace of a few steps to argv[1]/prof<rank>.json."""
import multiprocessing as mp
import os
import sys
import time


def worker(local_rank: int, out_dir: str, go_file: str) -> None:
    import torch

    torch.cuda.set_device(local_rank)
    torch.manual_seed(local_rank)
    layers = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(512, 512), torch.nn.GELU())])
    model = layers.to("cuda", torch.bfloat16).eval()
    x = torch.randn(4, 512, device="cuda", dtype=torch.bfloat16)
    step = torch.compile(model, mode="reduce-overhead")
    t_end = time.monotonic() + 110  # bounded even if the test never writes go_file
    with torch.inference_mode():
        for _ in range(3):  # warm-up, then cudagraph trees record
            step(x)
        steady_file = os.environ.get("GRAPHMON_BENCH_STEADY_FILE")  # bench/deploy/first_data.py: no profile
        while not os.path.exists(go_file) and time.monotonic() < t_end:
            for _ in range(50):
                step(x)
            torch.cuda.synchronize()
            if steady_file and not os.path.exists(steady_file):  # the first 50 steps replayed the compiled graph
                from steady import mark_steady  # (this directory)

                mark_steady()
            time.sleep(0.005)
        if steady_file:
            return
        import graphmon

        graphmon.detach()
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(30):
                step(x)
            torch.cuda.synchronize()
        prof.export_chrome_trace(os.path.join(out_dir, f"prof{local_rank}.json"))


def engine_core(n: int, out_dir: str, go_file: str) -> None:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(r, out_dir, go_file)) for r in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise SystemExit(1)


def main(out_dir: str, go_file: str) -> int:
    import torch  # the API server imports torch and never touches CUDA

    n = min(2, torch.cuda.device_count())
    p = mp.get_context("spawn").Process(target=engine_core, args=(n, out_dir, go_file))
    p.start()
    p.join()
    return p.exitcode or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
