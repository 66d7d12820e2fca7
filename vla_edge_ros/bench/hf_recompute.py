"""HuggingFace transformers recomputing a whole sequence, timed: the outside baseline of `bench csr`.

What "recompute everything" costs on a mainstream stack, one forward of HF's
model over the whole sequence:

    inputs     the very rows our backend gets (inputs_embeds [1, T, hidden]: prefix token embeddings,
               vision rows, suffix token embeddings), put on HF's device before the clock starts
               (HF's best case: our recompute uploads its rows inside its timing)
    attention  SDPA (torch's fused attention kernels), causal over the T rows
    cache      none kept (use_cache=False): a recompute has no later step to serve
    head       the last row only (logits_to_keep=1): HF is not charged for the full-vocabulary head on
               every row; the last row's logits come back to the host, as ours do
    clock      HF_WARMUP untimed calls, then each repeat between two device synchronizations on the
               host clock, the clock our side is timed with

Models: on the GPU a twin of the random model the CUDA backend runs (the
same bf16 weights: bench/gpu_inputs.random_model_with_twin), computing in
bf16; on the CPU the model directory the numpy backend runs, loaded by
transformers in float32 (the numpy backend's dtype) with torch on the same
thread count as the backend's BLAS. torch and transformers are imported
inside the functions: importing this module stays cheap and GPU-free.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

HF_ATTENTION = "sdpa"
HF_WARMUP = 1


class HfRecompute:
    """One HF model and the timed full recompute of a sequence of rows on it."""

    def __init__(self, model, where: str):
        self.model = model.eval()
        self.where = where                  # how the model came to be, for the printed header

    @classmethod
    def from_model_dir(cls, model_dir: str | Path, threads: int) -> HfRecompute:
        """The CPU side: the snapshot in float32 with SDPA attention, torch on `threads` threads."""
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        torch.set_num_threads(threads)
        hf_logging.disable_progress_bar()
        model, info = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                           attn_implementation=HF_ATTENTION, output_loading_info=True)
        if info.get("missing_keys"):
            # HF would fill these with random init: it would time another model than ours.
            raise ValueError(f"{model_dir}: transformers found no weights for {sorted(info['missing_keys'])[:8]}")
        return cls(model, f"{model_dir}, torch {threads} thread(s)")

    def describe(self) -> dict:
        import torch
        import transformers

        return {"library": f"transformers {transformers.__version__}, torch {torch.__version__}",
                "dtype": str(self.model.dtype).removeprefix("torch."), "device": str(self.model.device),
                "attention": self.model.config._attn_implementation, "logits_to_keep": 1, "use_cache": False,
                "warmup": HF_WARMUP, "model": self.where}

    def run(self, rows: np.ndarray, repeats: int) -> tuple[list[float], np.ndarray]:
        """Time `repeats` full forwards over rows [T, hidden]; returns (ms per repeat, last row's logits [vocab])."""
        import torch

        assert rows.ndim == 2 and rows.shape[1] == self.model.config.hidden_size, f"{rows.shape=}"
        device = self.model.device
        x = torch.as_tensor(rows, device=device).to(self.model.dtype)[None]            # [1, T, hidden]
        samples, logits = [], None
        with torch.inference_mode():
            for i in range(HF_WARMUP + repeats):
                _sync(device)
                t = time.perf_counter()
                out = self.model(inputs_embeds=x, use_cache=False, logits_to_keep=1)
                logits = out.logits[0, -1].float().cpu().numpy()                       # [vocab]; waits for the device
                _sync(device)
                if i >= HF_WARMUP:
                    samples.append((time.perf_counter() - t) * 1e3)
                del out
        del x
        return samples, logits

    def close(self) -> None:
        """Free the model (device memory on the GPU) before our backend's sweep runs."""
        import torch

        on_gpu = self.model.device.type == "cuda"
        del self.model
        if on_gpu:
            torch.cuda.empty_cache()


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
