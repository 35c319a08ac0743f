"""Test-wide settings and shared fixtures.

Tiny models run fastest on one thread (and avoid oversubscribing CI's 2 cores).
"""

import logging

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def sglang_parse():
    """SGLang 0.5.23's own server-argument parser (``prepare_server_args``; CPU-importable)."""
    from sglang.srt.server_args import prepare_server_args

    root = logging.getLogger()
    saved = (root.handlers[:], root.level)

    def parse(argv):
        try:
            return prepare_server_args(argv)
        finally:  # prepare_server_args calls logging.basicConfig(force=True); undo it
            root.handlers[:] = saved[0]
            root.setLevel(saved[1])

    return parse
