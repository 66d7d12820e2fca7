"""ActionCodec: bin mapping, constrained argmax (HF constrained greedy generation as oracle), errors."""
import dataclasses

import numpy as np
import pytest

from vla_edge_ros import config
from vla_edge_ros.core.action_codec import ActionCodec, NonFiniteLogitsError

ACTION = config.load().action
VOCAB = 600


def test_bins_are_the_last_ids_and_map_linearly_onto_minus_one_one():
    codec = ActionCodec(VOCAB, ACTION)
    ids = codec.bin_token_ids
    assert ids.size == ACTION.num_bins and ids[-1] == VOCAB - 1 and ids[0] == VOCAB - ACTION.num_bins
    values = codec.to_values(ids)
    assert values.dtype == np.float32
    assert values[0] == -1.0 and values[-1] == 1.0
    assert np.all(np.diff(values) > 0)
    np.testing.assert_allclose(np.diff(values), 2.0 / (ACTION.num_bins - 1), rtol=1e-5)
    assert [codec.bin_of(t) for t in ids[[0, 7, -1]]] == [0, 7, ACTION.num_bins - 1]
    assert codec.to_values([]).shape == (0,)


def test_select_ignores_higher_scores_outside_the_bins():
    codec = ActionCodec(VOCAB, ACTION)
    rng = np.random.default_rng(0)
    logits = rng.normal(size=VOCAB).astype(np.float32)
    logits[3] = 100.0                                   # the overall winner is not an action
    best_bin = int(np.argmax(logits[codec.bin_token_ids]))
    assert codec.select(logits) == codec.bin_token_ids[best_bin]
    assert codec.select(logits[None, :]) == codec.select(logits)
    logits[:VOCAB - ACTION.num_bins] = -np.inf          # a mask outside the bins is legitimate
    assert codec.select(logits) == codec.bin_token_ids[best_bin]


def test_constrained_greedy_decode_matches_hf_generate_with_allowed_tokens():
    torch = pytest.importorskip("torch")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).eval()
    codec = ActionCodec(VOCAB, ACTION)
    bins = codec.bin_token_ids.tolist()
    prompt = torch.tensor([[11, 22, 33, 44, 55, 66]])

    with torch.no_grad():
        oracle = model.generate(prompt, max_new_tokens=ACTION.num_tokens, do_sample=False,
                                prefix_allowed_tokens_fn=lambda batch, ids: bins, pad_token_id=0)
        ours, unconstrained_outside = [], 0
        seq = prompt
        for _ in range(ACTION.num_tokens):
            logits = model(seq).logits[0, -1].float().numpy()                  # [vocab]
            unconstrained_outside += int(np.argmax(logits) not in bins)
            tok = codec.select(logits)
            ours.append(tok)
            seq = torch.cat([seq, torch.tensor([[tok]])], dim=1)
    assert ours == oracle[0, prompt.shape[1]:].tolist()
    assert unconstrained_outside > 0, "the constraint never mattered: the test would not catch a missing mask"
    values = codec.to_values(np.asarray(ours))
    assert values.shape == (ACTION.num_tokens,) and np.all(np.abs(values) <= 1.0)


def test_non_finite_logits_raise_the_specific_error():
    codec = ActionCodec(VOCAB, ACTION)
    logits = np.zeros(VOCAB, np.float32)
    logits[5] = np.nan                                   # NaN anywhere means the forward pass broke
    with pytest.raises(NonFiniteLogitsError, match="NaN"):
        codec.select(logits)
    logits = np.zeros(VOCAB, np.float32)
    logits[-1] = np.inf
    with pytest.raises(NonFiniteLogitsError, match="infinite"):
        codec.select(logits)


def test_errors_name_the_bad_thing():
    codec = ActionCodec(VOCAB, ACTION)
    with pytest.raises(ValueError, match="smaller than action.num_bins"):
        ActionCodec(ACTION.num_bins - 1, ACTION)
    with pytest.raises(ValueError, match="token id 3 is not an action bin"):
        codec.bin_of(3)
    with pytest.raises(ValueError, match=r"\[3, 600\]"):
        codec.to_values([VOCAB - 1, 3, VOCAB])
    with pytest.raises(ValueError, match="logits must be"):
        codec.select(np.zeros(VOCAB - 1, np.float32))
    with pytest.raises(ValueError, match="logits must be"):
        codec.select(np.zeros((2, VOCAB), np.float32))
    two_bins = ActionCodec(10, dataclasses.replace(ACTION, num_bins=2))
    np.testing.assert_array_equal(two_bins.to_values([8, 9]), [-1.0, 1.0])
