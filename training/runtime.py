"""Run-time helpers shared by every stage: the timestamped log, seeding, device sync and the bf16
autocast (CUDA only; CPU runs in float32)."""

from __future__ import annotations

import random
import time

import torch

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device, enabled=True):
    return torch.autocast(
        device_type=device.type, dtype=torch.bfloat16, enabled=enabled and device.type == "cuda"
    )
