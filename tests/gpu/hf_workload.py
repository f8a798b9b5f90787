"""HF transformers static-cache generate on a random-weight small Llama (run by test_hf_generate.py
under `graphmon run`). Phase 1: generate until the file argv[2] exists (graphmon samples).
Phase 2: detach graphmon (CUPTI is exclusive), profile a few generate calls with torch.profiler and
write the Chrome trace to argv[1]/prof.json. ``build()`` is the model and generate arguments, shared
with the GPU benchmarks (bench/diag/replays.py, bench/deploy/first_data.py, deploy_restart.py)."""
import os
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from steady import STEADY_ENV, mark_steady  # (this directory)


def build(batch_size: int = 1, new_tokens: int = 48):
    """(model, input ids, generate kwargs): static cache, so transformers compiles the decode
    step (torch.compile reduce-overhead: cudagraph trees) and replays one graph per token."""
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=1024, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    ids = torch.randint(0, 1024, (batch_size, 8), device="cuda")
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, cache_implementation="static")
    return model, ids, kw


def main(out_dir: str, go_file: str) -> int:
    out_trace = os.path.join(out_dir, "prof.json")
    model, ids, kw = build()
    t_end = time.monotonic() + 110  # bounded even if the test never writes go_file (cold compile included)
    with torch.inference_mode():
        n = 0
        while not os.path.exists(go_file) and time.monotonic() < t_end:
            model.generate(ids, **kw)
            n += 1
            if n == 1 and mark_steady():  # its last ~47 decode steps replayed the compiled graph
                t_end = time.monotonic() + 60
        if os.environ.get(STEADY_ENV):
            return 0
        import graphmon

        graphmon.detach()  # give CUPTI back: torch.profiler needs it
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(2):
                model.generate(ids, **kw)
            torch.cuda.synchronize()
        prof.export_chrome_trace(out_trace)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
