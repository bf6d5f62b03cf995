"""The candidate of ``python -m bench.chaos_evals``: the benchmark's ``looper``, unchanged, with
a scorer that takes ``CHAOS_SCORE_SECONDS`` to answer, as a model judging the answers would, so
that a drawn kill can land while a candidate is scored as well as while it runs."""

from __future__ import annotations

import os
import time
from typing import Any

from bench.eval_candidate import looper

__all__ = ["looper", "score"]


def score(recorded: Any, candidate: Any) -> float:
    time.sleep(float(os.environ.get("CHAOS_SCORE_SECONDS", "0")))
    return 1.0 if recorded == candidate else 0.0
