"""The candidate of ``python -m bench.evals``: the benchmark's ``looper``, unchanged, on the
model server ``BENCH_MODEL_URL`` names (so every call of the evaluation matches the recording)."""

from __future__ import annotations

import os

from bench.agents import build_agents

looper = build_agents(os.environ.get("BENCH_MODEL_URL", "http://127.0.0.1:9"))[0]
