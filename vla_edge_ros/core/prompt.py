"""Token layout of the policy's context (the CSR ordering).

    [ static prefix | frame 0 | frame 1 | ... | frame k | dynamic suffix | action tokens ]
      system prompt   32 vision tokens each (append-only)   instruction +   decoded, then
      + embodiment                                          action prompt   discarded

The prefix is computed once. Frames are appended and only ever removed by
eviction. The suffix and the decoded action tokens are written to transient
slots every cycle and released afterwards, so a new instruction never
invalidates the cached frames.

RoPE positions follow the layout: prefix 0..P-1, then 32 per frame in order,
then the suffix at the next free position. Evicting a frame leaves a gap (and
stale attention context in the frames after it) until a reconciled swap or an
in-place rebuild re-bases the frames contiguously after the prefix again
(core/reconciliation.py, Engine.import_state / rebuild_in_place).
"""
from __future__ import annotations

import numpy as np

from ..config import INSTRUCTION_CHARS_PER_TOKEN, PromptConfig


def prefix_text(cfg: PromptConfig) -> str:
    return f"{cfg.system_prompt}\n{cfg.embodiment}\n"


def suffix_text(cfg: PromptConfig, instruction: str) -> str:
    return f"\nTask: {instruction}\n{cfg.action_prompt}"


def encode_text(tokenizer, text: str) -> np.ndarray:
    """[N] int64 token ids, no special tokens added (the layout above is the whole prompt)."""
    return np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)


def suffix_ids(tokenizer, cfg: PromptConfig, instruction: str) -> np.ndarray:
    """Suffix token ids, keeping the last max_suffix_tokens (the action prompt must survive truncation). The
    instruction is cut to its end first (config.INSTRUCTION_CHARS_PER_TOKEN): the tokens kept are its last ones
    either way."""
    instruction = instruction[-instruction_char_limit(cfg):]
    ids = encode_text(tokenizer, suffix_text(cfg, instruction))
    if ids.size == 0:
        raise ValueError("the dynamic suffix tokenizes to nothing; set prompt.action_prompt")
    return ids[-cfg.max_suffix_tokens:]


def instruction_char_limit(cfg: PromptConfig) -> int:
    """The characters of an instruction that can matter: the rest is truncated away as tokens anyway."""
    return cfg.max_suffix_tokens * INSTRUCTION_CHARS_PER_TOKEN
