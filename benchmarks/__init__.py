"""The benchmark suite: django_distlock against its peers, in one run.

Run it with ``scripts/bench`` (or ``python -m benchmarks``; ``--quick`` for a
smoke run). See docs/performance.md.
"""
