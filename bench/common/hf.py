"""The "HF" workload of the overhead and observer benches: a random-weight Llama (8 layers,
hidden 1024) decoding with Hugging Face transformers' static-cache ``generate``, exactly as a user
calls it; transformers compiles the decode forward itself (torch.compile reduce-overhead, CUDA
graphs through cudagraph trees; the prefill runs eager). GPU only; torch is imported when called."""

from __future__ import annotations

import time

import numpy as np

LAYERS, HIDDEN = 8, 1024


def llama():
    """(model, config): the random-weight Llama on the GPU, bf16, set to always generate every
    token it is asked for and to let transformers compile its decode forward."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=HIDDEN, intermediate_size=2816, num_hidden_layers=LAYERS, num_attention_heads=16,
                      num_key_value_heads=8, vocab_size=32000, max_position_embeddings=1024)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    gc = model.generation_config
    gc.pad_token_id = gc.eos_token_id = None  # random weights: never stop early, always new_tokens steps
    if getattr(gc, "disable_compile", None):
        gc.disable_compile = False  # transformers compiles the decode forward itself (a compileable cache)
    return model, cfg


def hf_workload(bs: int, new_tokens: int):
    """(run_once, meta): run_once() is one ``generate`` call of ``new_tokens`` tokens at batch
    ``bs`` and returns each step's end time (perf_counter s) from a LogitsProcessor that only
    reads the clock (the outputs are transformers' own copies)."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    model, cfg = llama()
    cc = getattr(model.generation_config, "compile_config", None)
    compile_info = {"compile_config": repr(cc), "mode": getattr(cc, "mode", None)}

    class Stamps(LogitsProcessor):
        """Called once per generated token on the host: reads the clock, returns the scores as is."""

        def __init__(self) -> None:
            self.t: list[float] = []

        def __call__(self, input_ids, scores):
            self.t.append(time.perf_counter())
            return scores

    ids = torch.randint(0, cfg.vocab_size, (bs, 16), device="cuda")
    mask = torch.ones_like(ids)

    def run_once() -> np.ndarray:
        st = Stamps()
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                           cache_implementation="static", logits_processor=LogitsProcessorList([st]))
        return np.asarray(st.t)  # step end times: the first token is the prefill's, then one per decode step

    return run_once, {"compile": compile_info, "config": {"layers": LAYERS, "hidden": HIDDEN, "batch": bs,
                                                          "new_tokens": new_tokens}}
