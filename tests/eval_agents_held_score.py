"""The evaluation tests' triage agent with a scorer that holds its first call until the process
is killed: a test kills the evaluation's worker in the middle of scoring.

The scorer writes the file ``EVAL_SCORE_MARK`` names when it starts; a mark that is already
there means an earlier process was killed while holding, so this call scores at once.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from tests.eval_agents import triage

__all__ = ["score", "triage"]


def score(recorded: Any, candidate: Any) -> float:
    mark = Path(os.environ["EVAL_SCORE_MARK"])
    if not mark.exists():
        mark.write_text("scoring\n", encoding="utf-8")
        threading.Event().wait()  # until the test kills this process
    return 1.0
