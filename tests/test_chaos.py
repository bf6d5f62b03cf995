"""The fuzzer of operator actions and faults, on a fixed set of seeds (``bench/chaos.py``).

Each seed draws an agent graph (handoffs with ``on_handoff``, an agent tool, subagents, an MCP
tool, approval-gated tools, summarize compaction, continue-as-new, a dollar limit with its
``on_limit``) and a schedule of steers, sends, pauses, approvals and denials (by the update, by
signal, in bulk, racing each other, and again once answered), forks, a cancel, SIGKILLed and
restarted workers, deploys of a changed definition and budget changes (raise, set, finish,
cancel at the limit), against real worker processes and the session's dev server. Every run
must end within a bound once the actions stop, with no workflow task failure anywhere, no write
started twice, every fork starting from the original's request at its turn, every steer
reaching the model once, no spend past the highest limit a run had, every operator event naming
its author, no child left waiting for an ended parent's budget and every call answered once. A
failing seed is reported with what broke and the command that runs it alone; ``python -m
bench.chaos --runs N --seed S`` runs more seeds (bench/README.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import Client

from bench.chaos import run_seeds, table
from relaykit.devserver import DevServer
from relaykit.testing.scripted_server import ScriptedModelServer

SEEDS = [18, 24, 48, 82, 106, 386, 1661]
"""Chosen to cover every part of the graph, every kind of action and every ``on_limit`` between
them (see ``bench.chaos_model.draw``): 18 kills its MCP server and deploys a handoff run with
subagents, MCP and summaries; 24 does every action but cancel on a summarizing run with
subagents; 48 kills its MCP server, forks, pauses and cancels with an agent tool and MCP; 82
pauses and cancels at its limit a budgeted handoff run with an agent tool that finishes at its
limit; 106 steers, raises and pauses a budgeted run with subagents that fails at its limit and
continues as new; 386 sets the limit, asks for the best answer, kills and forks a budgeted MCP
run that waits at its limit; 1661 deploys another model under a budgeted run with subagents
that continues as new (it wedged before budgeted runs priced a deployed model)."""
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
    assert sum(o.mcp_servers_killed for o in outcomes) > 0  # seeds 18 and 48
    assert sum(o.mcp_writes for o in outcomes) > 0
    assert sum(len(o.ended) for o in outcomes) > len(SEEDS)  # forks ran too
    assert sum(o.budget_runs for o in outcomes) > 0
    assert sum(o.other_model_calls for o in outcomes) > 0
    assert sum(o.actions["deploy that changed approvals"] for o in outcomes) > 0
    assert sum(o.operator_events for o in outcomes) > 0
    by_signal = ("answer by signal", "answer by bulk", "answer by race")
    assert sum(o.actions[mode] for o in outcomes for mode in by_signal) > 0
