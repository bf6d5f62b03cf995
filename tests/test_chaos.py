"""The fuzzer of operator actions and faults, on a fixed set of seeds (``bench/chaos.py``).

Each seed draws an agent graph (handoffs with ``on_handoff``, an agent tool, subagents, an MCP
tool, approval-gated tools, summarize compaction, continue-as-new) and a schedule of steers,
sends, pauses, approvals and denials, forks, a cancel, SIGKILLed and restarted workers and
deploys of a changed definition, against real worker processes and the session's dev server.
Every run must end within a bound once the actions stop, with no workflow task failure anywhere,
no write started twice, every fork starting from the original's request at its turn and every
steer reaching the model once. A failing seed is reported with what broke and the command that
runs it alone; ``python -m bench.chaos --runs N --seed S`` runs more seeds (bench/README.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import Client

from bench.chaos import run_seeds, table
from relaykit.devserver import DevServer
from relaykit.testing.scripted_server import ScriptedModelServer

SEEDS = [5, 9, 18, 20, 24, 48]
"""Chosen to cover every part of the graph and every kind of action between them (see
``bench.chaos_model.draw``): 5 deploys, forks, steers and cancels a run that continues as new;
9 kills and forks a handoff run with an agent tool, subagents and summaries; 18 kills and
deploys a handoff run with subagents, MCP and summaries; 20 deploys, forks, kills and steers a
summarizing run; 24 does every action but cancel on a summarizing run with subagents; 48 kills,
forks, pauses and cancels with an agent tool and MCP."""
CONCURRENCY = 2


@pytest.mark.chaos
async def test_fixed_seeds_of_operator_actions_and_faults_keep_every_run_safe(
    client: Client, temporal_server: DevServer, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    outcomes = await run_seeds(
        client, model_server, temporal_server.address, SEEDS, tmp_path, CONCURRENCY
    )
    print(table(outcomes))  # shown with -s, and with a failure
    failing = [o.report() for o in outcomes if o.failed]
    assert not failing, "\n\n".join(failing)
    assert sum(o.actions["kill"] for o in outcomes) > 0
    assert sum(len(o.ended) for o in outcomes) > len(SEEDS)  # forks ran too
