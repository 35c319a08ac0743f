"""Shared by the tree tests: hypothesis settings and DraftTree <-> oracle-field conversion."""

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
