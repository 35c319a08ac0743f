"""Load tests for SGLang speculative decoding: a closed-loop concurrency sweep and a comparison report.

- ``python -m loadtests.sweep ...``   (also ``python -m loadtests``): run a sweep, append JSONL records.
- ``python -m loadtests.compare RUNS... -o OUTDIR``: markdown report and PNG plots across runs.

See loadtests/README.md.
"""
