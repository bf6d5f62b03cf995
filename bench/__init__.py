"""Benchmarks: relaykit's orchestration overhead against a bare-Temporal floor.

Run ``python -m bench`` (``--help`` for options). See ``bench/README.md`` for what each scenario
measures and the latest figures.

This package must stay import-free at the top level: the floor's workflows live in
:mod:`bench.floor` and are passed through the workflow sandbox under the ``bench`` prefix.
"""
