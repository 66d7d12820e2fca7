"""Action tokens <-> action values.

The last `num_bins` ids of the vocabulary are the action bins:

    token id  vocab_size - num_bins + b   <->   bin b in [0, num_bins)
    value     -1 + 2 * b / (num_bins - 1)        bin 0 -> -1, last bin -> +1

Decoding is constrained: the chosen token is the argmax over the bin ids only,
so every decoded token is a valid action whatever the rest of the vocabulary
scores.
"""
from __future__ import annotations

import numpy as np

from ..config import ActionConfig
from ..model.errors import NonFiniteLogitsError
from ..model.host_cycle import restricted_argmax

__all__ = ["ActionCodec", "NonFiniteLogitsError"]     # the codec raises NonFiniteLogitsError (model/errors.py)


class ActionCodec:
    def __init__(self, vocab_size: int, action_cfg: ActionConfig):
        if action_cfg.num_bins > vocab_size:
            raise ValueError(f"ActionCodec: vocab_size {vocab_size} is smaller than action.num_bins {action_cfg.num_bins}")
        self.vocab_size = int(vocab_size)
        self.num_bins = int(action_cfg.num_bins)
        self.first_bin_id = self.vocab_size - self.num_bins

    @property
    def bin_token_ids(self) -> np.ndarray:
        """[num_bins] int64 vocabulary ids of bins 0 .. num_bins-1."""
        return np.arange(self.first_bin_id, self.vocab_size, dtype=np.int64)

    def select(self, logits: np.ndarray) -> int:
        """Vocabulary id of the highest-scoring action bin; logits [vocab] or [1, vocab]."""
        logits = np.asarray(logits)
        if logits.ndim == 2 and logits.shape[0] == 1:
            logits = logits[0]
        if logits.ndim != 1 or logits.shape[0] != self.vocab_size:
            raise ValueError(f"ActionCodec.select: logits must be [{self.vocab_size}] or [1, {self.vocab_size}], got {logits.shape}")
        return restricted_argmax(logits, self.first_bin_id, self.num_bins)

    def bin_of(self, token_id: int) -> int:
        """Bin index of one action token id; ValueError for an id outside the bins."""
        tid = int(token_id)
        if not self.first_bin_id <= tid < self.vocab_size:
            raise ValueError(f"token id {tid} is not an action bin (bins are ids {self.first_bin_id}..{self.vocab_size - 1})")
        return tid - self.first_bin_id

    def to_values(self, token_ids) -> np.ndarray:
        """[n] action token ids -> [n] float32 values in [-1, 1]."""
        ids = np.asarray(token_ids)
        if ids.ndim == 1 and ids.size == 0:
            return np.zeros(0, dtype=np.float32)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"ActionCodec.to_values: token ids must be a 1-D integer array, got {ids.dtype} {ids.shape}")
        outside = ids[(ids < self.first_bin_id) | (ids >= self.vocab_size)]
        if outside.size:
            raise ValueError(f"token ids {outside.tolist()} are not action bins "
                             f"(bins are ids {self.first_bin_id}..{self.vocab_size - 1})")
        bins = (ids - self.first_bin_id).astype(np.float64)
        return (-1.0 + 2.0 * bins / (self.num_bins - 1)).astype(np.float32)
