"""Shared by the engine tests: HF transformers recomputing an engine's state from scratch, and cosine."""
import numpy as np

from vla_edge_ros.core.prompt import encode_text, prefix_text


def oracle_logits(hf, eng) -> np.ndarray:
    """HF from scratch: prefix + the vision rows of every frame the engine holds + suffix, positions 0..T-1."""
    import torch
    emb = hf.get_input_embeddings()
    prefix = encode_text(eng.tokenizer, prefix_text(eng.cfg.prompt))
    rows = np.concatenate([eng.state.frames[r.frame_id].tokens for r in eng.state.kv.retained()])
    with torch.inference_mode():
        x = torch.cat([emb(torch.from_numpy(prefix)), torch.from_numpy(rows), emb(torch.from_numpy(eng.suffix))])[None]
        return hf(inputs_embeds=x, position_ids=torch.arange(x.shape[1])[None]).logits[0, -1].numpy()


def cosine(a, b) -> float:
    """Cosine of two arrays of any shape, in float64."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
