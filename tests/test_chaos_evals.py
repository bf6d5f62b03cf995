"""The fuzzer of killed evaluations, on a fixed set of seeds (``bench/chaos_evals.py``).

Each seed runs ``relaykit eval`` over the same recorded runs with a drawn concurrency, SIGKILLs
the command (and the worker in it) at one to three drawn moments, and runs it again after each
kill. The last command must end within a bound with every recorded run passed, every call
matched, and no workflow task failure in the evaluation or its candidates; ``python -m
bench.chaos_evals --runs N --seed S`` runs more seeds (bench/README.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos_evals import LATENCY_MS, record_runs, run_seeds, table
from bench.procs import Child
from relaykit.devserver import DevServer

SEEDS = [6, 9, 11]
"""Three kills at concurrency 1 (6), two at 2 (9), two at 4 (11), see ``Plan.draw``: each once
killed a worker in the middle of scoring, which stalled the evaluation for the scoring
activity's whole 5-minute limit before it heartbeat."""


@pytest.mark.chaos
async def test_evaluations_killed_at_drawn_moments_finish_with_the_same_report(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    with Child("model", ["-m", "bench.model_server", "--latency-ms", str(LATENCY_MS)]) as model:
        ids = await record_runs(temporal_server.address, model.info, 6, 3, tmp_path)
        outcomes = await run_seeds(temporal_server.address, model.info, ids, SEEDS, tmp_path, 3)
    print(table(outcomes))  # shown with -s, and with a failure
    failing = [o.report() for o in outcomes if o.failed]
    assert not failing, "\n\n".join(failing)
    assert sum(o.killed for o in outcomes) > 0
