"""Test-wide settings: tiny models run fastest on one thread (and avoid oversubscribing CI's 2 cores)."""

import torch

torch.set_num_threads(1)
