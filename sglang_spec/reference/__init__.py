"""Exact standalone speculative decoding on HF Transformers: the lossless oracle and the CPU demo engine."""

from .engine import METHODS, STAGES, GenerateResult, StepStats, generate, tokens_per_step

__all__ = ["METHODS", "STAGES", "GenerateResult", "StepStats", "generate", "tokens_per_step"]
