"""Architecture of a Qwen2 / Llama-family decoder, read from a HF config.json.

The numbers here describe the network only; where it lives (weights) and how
it is run (backends) are elsewhere.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, asdict
from pathlib import Path

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")


class ModelFormatError(ValueError):
    """A model directory, config or tensor does not describe a usable model."""


@dataclass(frozen=True)
class ModelSpec:
    model_type: str          # "qwen2" | "llama"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    qkv_bias: bool           # Qwen2: q/k/v projections carry a bias
    tie_word_embeddings: bool
    max_position_embeddings: int

    def __post_init__(self):
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelFormatError(f"model_type {self.model_type!r} not supported; supported: {SUPPORTED_MODEL_TYPES}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ModelFormatError(f"config.json: {name} must be > 0, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ModelFormatError(f"num_attention_heads ({self.num_heads}) must be a multiple of num_key_value_heads ({self.num_kv_heads})")

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, bytes_per_element: int = 4) -> int:
        # K and V, every layer, every KV head (GQA: KV heads, not query heads).
        return 2 * self.num_layers * self.kv_dim * bytes_per_element

    @classmethod
    def from_hf_config(cls, cfg: dict) -> "ModelSpec":
        if not isinstance(cfg, dict):
            raise ModelFormatError(f"config.json holds a JSON {type(cfg).__name__}, not an object of model settings")
        model_type = cfg.get("model_type")
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            return cls(
                model_type=model_type,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads", heads)),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rope_theta=float(cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                qkv_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
            )
        except KeyError as exc:
            raise ModelFormatError(f"config.json is missing required key {exc.args[0]!r}") from exc
        except (TypeError, ValueError) as exc:           # e.g. "hidden_size": null or "abc"
            raise ModelFormatError(f"config.json: a model setting is not a number ({exc})") from exc

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelSpec":
        path = Path(model_dir) / "config.json"
        try:
            return cls.from_hf_config(json.loads(path.read_text()))
        except FileNotFoundError as exc:
            raise ModelFormatError(f"{path}: no config.json in model directory") from exc
        except json.JSONDecodeError as exc:
            raise ModelFormatError(f"{path}: not valid JSON ({exc})") from exc

    def as_dict(self) -> dict:
        return asdict(self)
