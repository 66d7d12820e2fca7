"""What INT4 costs a model: the quantized snapshot against its unquantized original on one text.

Both run through the numpy backend (itself checked against HF by `vla-edge
verify`), teacher-forced over QUALITY_TEXT in one prefill: at every position
both see the same tokens, so the figures compare the two models' next-token
predictions, not two diverging generations:

    top-1 agreement   positions where both models' argmax is the same token
    perplexity        exp(mean negative log-likelihood of the text's next token), each model
    mean KL           mean over positions of KL(unquantized || quantized), in nats

No threshold: how much INT4 may cost is a judgement per model; these are the
figures to judge it by (issue 23 asks for them on the real SmolLM2-135M).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

# Plain English prose (written for this check), so a trained model's perplexity is meaningful.
QUALITY_TEXT = (
    "A robot arm that works next to people has to answer quickly and predictably. Every thirty milliseconds a "
    "camera delivers a new picture of the table, and the controller must decide where the gripper goes next. "
    "If the answer comes late, the arm keeps moving on an old plan, and a small delay can turn into a missed "
    "grasp or a cup pushed off the edge. Engineers therefore measure not only how often the policy is right, "
    "but how long each decision takes in the worst case.\n\n"
    "Most of that time is spent reading the model's weights from memory. A language model with seven billion "
    "parameters stored in sixteen-bit numbers occupies about fourteen gigabytes, and every generated token "
    "reads all of them once. Storing each weight in four bits, with a shared scale for every group of one "
    "hundred and twenty-eight weights, cuts the traffic by almost four times. The price is a small rounding "
    "error in every weight, and the question is whether the model still chooses the same words.\n\n"
    "To find out, we give the original model and the compressed one the same paragraph and ask each, at every "
    "position, which word should come next. When both pick the same word, the compression did no visible harm "
    "there. Perplexity summarizes how surprised a model is by the real text: lower is better, and a good "
    "compression raises it only a little. The kitchen was quiet in the morning, the window was open, and the "
    "smell of fresh bread drifted into the garden where the children were playing with a red ball."
)


def compare(quantized_dir: str | Path, unquantized_dir: str | Path, text: str = QUALITY_TEXT) -> dict:
    """The figures of the module docstring (a JSON-able dict), for one text through both snapshots."""
    from ..model.factory import create_backend
    from ..model.int4_snapshot import weight_format
    from ..model.weights import load_tokenizer

    ids = np.asarray(load_tokenizer(quantized_dir).encode(text).ids, dtype=np.int64)       # [N]
    reference_ids = load_tokenizer(unquantized_dir).encode(text).ids
    if list(ids) != list(reference_ids):
        raise ValueError(f"{quantized_dir} and {unquantized_dir} tokenize the text differently: not one model")
    if weight_format(unquantized_dir) != "float":
        raise ValueError(f"{unquantized_dir}: --against-unquantized needs a float snapshot")
    logits = {}
    for which, model_dir in (("quantized", quantized_dir), ("unquantized", unquantized_dir)):
        backend = create_backend("numpy", model_dir, capacity=ids.size, weights=weight_format(model_dir))
        n = ids.size
        out = backend.forward(backend.embed(ids), np.arange(n), np.arange(n), np.zeros(0, np.int64), logits="all")
        logits[which] = out.logits[:-1].astype(np.float64)                                   # [N - 1, vocab]
    targets = ids[1:]                                                                        # [N - 1]
    logp = {k: _log_softmax(v) for k, v in logits.items()}                                   # [N - 1, vocab] each
    nll = {k: -v[np.arange(targets.size), targets] for k, v in logp.items()}                 # [N - 1] each
    p_ref = np.exp(logp["unquantized"])
    kl = np.sum(p_ref * (logp["unquantized"] - logp["quantized"]), axis=1)                  # [N - 1]
    agree = int(np.count_nonzero(logits["quantized"].argmax(1) == logits["unquantized"].argmax(1)))
    return {"quantized": str(quantized_dir), "unquantized": str(unquantized_dir), "positions": int(targets.size),
            "top1_agree": agree, "top1_agreement": agree / targets.size,
            "perplexity_quantized": float(np.exp(nll["quantized"].mean())),
            "perplexity_unquantized": float(np.exp(nll["unquantized"].mean())),
            "mean_kl_nats": float(kl.mean())}


def format_quality(q: dict) -> str:
    return "\n".join([
        f"quantized {q['quantized']}  vs  unquantized {q['unquantized']} (numpy backend, teacher-forced, "
        f"{q['positions']} positions of one text)",
        f"{'teacher-forced top-1 agreement':<34} {q['top1_agree']}/{q['positions']} "
        f"({100 * q['top1_agreement']:.2f}%)",
        f"{'perplexity, quantized':<34} {q['perplexity_quantized']:.3f}",
        f"{'perplexity, unquantized':<34} {q['perplexity_unquantized']:.3f}",
        f"{'mean KL(unquantized || quantized)':<34} {q['mean_kl_nats']:.5f} nats",
    ])


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=1, keepdims=True)                                   # [rows, vocab]
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
