"""``python -m bench.quality``: how often the bundled model (and the scripted stand-in) answers
the examples' prompts right, and how long each run takes.

Each case runs as a newcomer would start it: the triage prompts as ``relaykit run triage "…"
--wait`` does (the CLI's defaults: ``max_turns=50``, no ``answer_on_last_turn``), the travel
prompt as ``relaykit demo`` does (``max_turns=4``, ``answer_on_last_turn``). Every run goes
through a real worker and an in-memory Temporal dev server. "Right" is a plain check of the
answer written next to each case (the facts the tools returned), so a reader can judge it.

    python -m bench.quality                      # both models, each prompt once
    python -m bench.quality --model local --tries 5
    python -m bench.quality --model scripted --json quality.json

The exit status is non-zero when a run failed or took longer than ``--limit`` seconds (default
60), i.e. when the bundled model did not finish what it started.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Case:
    module: str
    agent: str
    prompt: str
    check: str
    """What a right answer holds, for the table."""
    right: Callable[[str, str], bool]
    """(answer, final agent) -> right?"""
    demo: bool = False


def _has(*patterns: str) -> Callable[[str], bool]:
    return lambda text: all(re.search(p, text, re.IGNORECASE) for p in patterns)


def _cases() -> list[Case]:
    from examples.demo import DEMO_PROMPT

    billing = _has(r"refund", r"approved|3-5|arriv")
    login = _has(r"degraded|fail|fix|500")
    return [
        Case("examples.triage", "triage", "I was charged twice",
             "billing answers; names the approved refund", lambda a, f: f == "billing" and billing(a)),
        Case("examples.triage", "triage", "Where is my refund for invoice INV-1042?",
             "billing answers; names the approved refund", lambda a, f: f == "billing" and billing(a)),
        Case("examples.triage", "triage", "I cannot sign in, the login page shows error 500",
             "support answers; says login is degraded", lambda a, f: f == "support" and login(a)),
        Case("examples.triage", "triage", "The app will not let me log in since this morning",
             "support answers; says login is degraded", lambda a, f: f == "support" and login(a)),
        Case("examples.demo", "travel_assistant", DEMO_PROMPT,
             "Paris and Tokyo forecasts, 500 EUR in JPY (81967)",
             lambda a, f: _has(r"14\s*°?C|rain", r"19\s*°?C|sunny", r"81[ ,.]?967")(a), demo=True),
    ]


@dataclass
class Outcome:
    case: Case
    model: str
    seconds: float
    answer: str
    right: bool
    failed: str | None = None
    calls: list[str] = field(default_factory=list)


async def _run_cases(model: str, cases: list[Case], tries: int, verbose: bool) -> list[Outcome]:
    from relaykit.client import connect, start_run
    from relaykit.dev import find_scripted_responder
    from relaykit.devserver import DevServer
    from relaykit.loading import load_agents
    from relaykit.models.local_server import ensure_local_server
    from relaykit.models.spec import ModelSpec, parse_model
    from relaykit.testing.scripted_server import ScriptedModelServer
    from relaykit.worker import Worker

    outcomes: list[Outcome] = []
    store = tempfile.mkdtemp(prefix="relaykit-quality-")
    scripted = ScriptedModelServer().start() if model == "scripted" else None
    if model == "local":
        ensure_local_server()
    try:
        with DevServer(port=0, headless=True, in_memory=True) as server:
            client = await connect(server.address)
            for module in dict.fromkeys(c.module for c in cases):
                if scripted is not None:
                    name = f"quality-{uuid.uuid4().hex[:8]}"
                    responder = find_scripted_responder(module)
                    assert responder is not None, module
                    scripted.respond(name, responder)
                    spec = ModelSpec(name=name, base_url=f"{scripted.base_url}/v1")
                else:
                    spec = parse_model("local:smollm2")
                queue = f"quality-{uuid.uuid4().hex[:8]}"
                agents = load_agents(module)
                async with Worker(
                    client, agents, task_queue=queue, default_model=spec, transcript_dir=store
                ):
                    for case in (c for c in cases if c.module == module):
                        for _ in range(tries):
                            outcome = await _one(client, queue, case, model, start_run)
                            _show(outcome, verbose)
                            outcomes.append(outcome)
    finally:
        if scripted is not None:
            scripted.stop()
        shutil.rmtree(store, ignore_errors=True)
    return outcomes


async def _one(client: Any, queue: str, case: Case, model: str, start_run: Any) -> Outcome:
    options: dict[str, Any] = (
        {"max_turns": 4, "answer_on_last_turn": True} if case.demo else {"max_turns": 50}
    )
    started = time.monotonic()
    handle = await start_run(client, case.agent, case.prompt, task_queue=queue, **options)
    try:
        result = await asyncio.wait_for(handle.result(), 600)
    except Exception as exc:  # noqa: BLE001 - a failed run is a measured outcome
        return Outcome(case, model, time.monotonic() - started, "", False, failed=str(exc))
    seconds = time.monotonic() - started
    answer = str(result.output)
    calls = [f"{c.name}({c.arguments})" for m in result.transcript for c in m.tool_calls]
    return Outcome(
        case, model, seconds, answer, case.right(answer, result.final_agent), calls=calls
    )


def _show(o: Outcome, verbose: bool) -> None:
    status = "right" if o.right else ("FAILED" if o.failed else "wrong")
    shown = o.failed or o.answer
    print(f"[{o.model}] {o.seconds:5.1f}s {status:6} {o.case.agent}: {o.case.prompt[:40]!r} "
          f"-> {' '.join(shown.split())[:160]!r}", file=sys.stderr, flush=True)
    if verbose:
        for c in o.calls:
            print(f"      {c[:160]}", file=sys.stderr, flush=True)


def _table(outcomes: list[Outcome], models: list[str]) -> str:
    lines = [
        "| prompt | right answer holds | " + " | ".join(f"{m}: right" for m in models)
        + " | " + " | ".join(f"{m}: seconds (max)" for m in models) + " |",
        "|---|---|" + "---|" * (2 * len(models)),
    ]
    by_case: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by_case.setdefault(o.case.prompt, []).append(o)
    for prompt, group in by_case.items():
        case = group[0].case
        rights, times = [], []
        for m in models:
            mine = [o for o in group if o.model == m]
            rights.append(f"{sum(o.right for o in mine)} of {len(mine)}" if mine else "–")
            times.append(f"{max(o.seconds for o in mine):.0f}" if mine else "–")
        lines.append(f"| `{case.agent}`: {prompt} | {case.check} | " + " | ".join(rights)
                     + " | " + " | ".join(times) + " |")
    totals = []
    for m in models:
        mine = [o for o in outcomes if o.model == m]
        totals.append(f"**{sum(o.right for o in mine)} of {len(mine)}**")
    lines.append("| all | | " + " | ".join(totals) + " |" + " |" * len(models))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["local", "scripted", "both"], default="both")
    parser.add_argument("--tries", type=int, default=1, help="runs per prompt (default 1)")
    parser.add_argument("--limit", type=float, default=60.0, help="seconds a run may take")
    parser.add_argument("--only", default="", help="run only prompts containing this text")
    parser.add_argument("--verbose", action="store_true", help="list each run's tool calls")
    parser.add_argument("--json", default=None, help="also write every outcome to this file")
    args = parser.parse_args(argv)
    models = ["local", "scripted"] if args.model == "both" else [args.model]
    cases = [c for c in _cases() if args.only.lower() in c.prompt.lower()]
    outcomes: list[Outcome] = []
    for model in models:
        outcomes += asyncio.run(_run_cases(model, cases, args.tries, args.verbose))
    print(_table(outcomes, models))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"model": o.model, "prompt": o.case.prompt, "seconds": round(o.seconds, 1),
                        "right": o.right, "answer": o.answer, "failed": o.failed, "calls": o.calls}
                       for o in outcomes], f, indent=2)
    bad = [o for o in outcomes if o.failed or o.seconds > args.limit]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
