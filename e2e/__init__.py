"""GPU end-to-end harnesses (real SGLang servers) and their offline CPU analysis.

Run from the repository root as modules (``python -m e2e.<name>``); see ``e2e/README.md``.
"""
