"""Shared by the tree tests: hypothesis settings, DraftTree <-> oracle-field conversion, and a
child process that runs Triton kernels on the CPU."""

import os
import subprocess
import sys

from hypothesis import HealthCheck, settings

from sglang_spec.tree import DraftTree

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_tree(f: dict, L: int) -> DraftTree:
    return DraftTree(
        tokens=f["tokens"],
        parents=f["parents"],
        depths=f["depths"],
        scores=f["scores"],
        num_nodes=f["num_nodes"],
        horizon=L,
    )


def fields(tree: DraftTree) -> dict:
    return dict(
        tokens=tree.tokens,
        parents=tree.parents,
        depths=tree.depths,
        scores=tree.scores,
        num_nodes=tree.num_nodes,
    )


def run_under_triton_interpreter(module: str, check: str, marker: str) -> None:
    """Run ``tests/<module>.py``'s ``check()`` in a child process with ``TRITON_INTERPRET=1``
    (which must be set before Triton is imported) and assert it printed ``marker``."""
    here = os.path.dirname(os.path.abspath(__file__))
    child = f"import sys; sys.path[:0] = [{os.path.dirname(here)!r}, {here!r}]; "
    child += f"import {module} as t; t.{check}(); print({marker!r})"
    proc = subprocess.run(
        [sys.executable, "-c", child],
        env=dict(os.environ, TRITON_INTERPRET="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and marker in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
