"""Test-wide settings and shared fixtures.

Tiny models run fastest on one thread (and avoid oversubscribing CI's 2 cores).
"""

import contextlib
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


class FakeCapture:
    """CUDA-graph capture faked on the CPU: ``torch.cuda.CUDAGraph``, ``torch.cuda.graph`` and
    ``torch.cuda.synchronize`` replaced. :meth:`scope` is the capture scope to pass, and every
    capture must run under its stream and pool; ``capturing`` is True inside a capture; each
    capture's ``on_capture()`` result (set it; None by default) is kept in ``captures``."""

    def __init__(self, monkeypatch):
        self.capturing = False
        self.captures: list = []
        self.on_capture = lambda: None

        class Graph:
            pass

        @contextlib.contextmanager
        def graph(g, pool=None, stream=None):
            assert isinstance(g, Graph) and (pool, stream) == ("pool", "stream")
            self.captures.append(self.on_capture())
            self.capturing = True
            yield
            self.capturing = False

        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", graph)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    @staticmethod
    @contextlib.contextmanager
    def scope():
        yield "stream", "pool"


@pytest.fixture
def fake_capture(monkeypatch):
    """:class:`FakeCapture` for the test."""
    return FakeCapture(monkeypatch)
