"""HuggingFace transformers as the numeric oracle: the same snapshot, fp32, eager attention.

torch and transformers are imported inside the functions, so importing this
module stays cheap and GPU-free.
"""
from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

# The attention implementation load_hf_model(round_kv_to_bf16=True) registers with transformers.
BF16_KV_ATTENTION = "eager_bf16_kv"


@dataclass
class OracleOutput:
    logits: np.ndarray          # [N, vocab] float32
    hidden_states: list         # num_layers + 1 arrays [N, hidden]: embeddings, layers 1..L-1, final-norm output


def load_hf_model(model_dir: str | Path, round_to_bf16: bool = False, device: str = "cpu",
                  round_kv_to_bf16: bool = False, keep_exact: frozenset = frozenset()):
    """`AutoModelForCausalLM` in float32 with eager attention, in eval mode on `device`.

    round_to_bf16: replace every parameter by its bfloat16-rounded value (still
    float32), so HF computes in fp32 on exactly the weights a bf16 backend holds;
    except the parameters named in keep_exact (an INT4 snapshot's dequantized
    projections: a bf16 backend computes with w_hat = q * scale exactly, so
    rounding them would give HF other weights than ours).
    round_kv_to_bf16: the eager attention reads K (after RoPE) and V rounded to
    bfloat16, as a backend with a bf16 KV arena does; all else stays fp32.
    """
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()        # a progress bar per load would bury the benchmark tables
    attention = "eager"
    if round_kv_to_bf16:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
        AttentionInterface.register(BF16_KV_ATTENTION, _eager_attention_on_bf16_kv)
        # A name without a mask function of its own gets no mask at all (not even the causal one): eager's.
        AttentionMaskInterface.register(BF16_KV_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["eager"])
        attention = BF16_KV_ATTENTION
    model, info = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                       attn_implementation=attention, output_loading_info=True)
    if info.get("missing_keys"):
        # HF would fill these with random init: the oracle would not be the snapshot.
        raise ValueError(f"{model_dir}: transformers found no weights for {sorted(info['missing_keys'])[:8]}")
    model.eval()
    if round_to_bf16:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name not in keep_exact:
                    param.copy_(param.to(torch.bfloat16).to(torch.float32))
    if device != "cpu":
        # fp32 must stay fp32 on the GPU too: no TF32 shortcuts in the oracle's matmuls.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        model.to(device)
    return model


def hf_forward(model, token_ids, position_ids=None) -> OracleOutput:
    """One forward pass over `token_ids` [N] (batch of one) without a cache."""
    import torch

    ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64), device=model.device)[None, :]   # [1, N]
    kwargs = {}
    if position_ids is not None:
        kwargs["position_ids"] = torch.as_tensor(np.asarray(position_ids, dtype=np.int64),
                                                 device=model.device)[None, :]                 # [1, N]
        # With position_ids and no attention_mask, transformers treats any position jump != 1 as the
        # start of a new packed sequence and blocks attention across it; an explicit all-ones mask
        # keeps one causal sequence whatever the positions are.
        kwargs["attention_mask"] = torch.ones_like(ids)
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False, **kwargs)
    return OracleOutput(logits=out.logits[0].float().cpu().numpy(),
                        hidden_states=[h[0].float().cpu().numpy() for h in out.hidden_states])


def hf_greedy(model, prompt_ids, num_new: int) -> list[int]:
    """Greedy continuation of `prompt_ids` through HF's own KV cache, new ids only.

    A plain loop rather than `generate`: generate's EOS handling (stop, or
    min_new_tokens masking the EOS logit) would change which token wins.
    """
    import torch

    ids = torch.as_tensor(np.asarray(prompt_ids, dtype=np.int64), device=model.device)[None, :]  # [1, N]
    new: list[int] = []
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        for _ in range(num_new):
            token = int(out.logits[0, -1].argmax())
            new.append(token)
            if len(new) == num_new:
                break
            step = torch.tensor([[token]], device=model.device)                           # [1, 1]
            out = model(input_ids=step, past_key_values=out.past_key_values, use_cache=True)
    return new


# ----------------------------------------------------------------------------
# Internal helpers


def _eager_attention_on_bf16_kv(module, query, key, value, attention_mask, **kwargs):
    """The model's own eager attention on K and V rounded to bfloat16 (torch's cast rounds to nearest even,
    as weights.round_to_bf16 does). Rounding again what HF's cache already held is a no-op, so cached
    decode steps see what a bf16 arena would hold too."""
    import torch

    # Each modeling_<type>.py defines its own eager_attention_forward; take the one of the calling layer.
    eager = importlib.import_module(type(module).__module__).eager_attention_forward
    key = key.to(torch.bfloat16).to(key.dtype)           # [B, KV, T, hd]
    value = value.to(torch.bfloat16).to(value.dtype)     # [B, KV, T, hd]
    return eager(module, query, key, value, attention_mask, **kwargs)
