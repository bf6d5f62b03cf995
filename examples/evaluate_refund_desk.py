"""Record 20 runs of the refund desk, evaluate the changed desk on them, print the report.

    python -m examples.evaluate_refund_desk

Offline: an in-memory Temporal dev server and a scripted model (:func:`~examples.refund_desk.
scripted_desk`). Against your own server and model the same steps are ``relaykit worker
examples.refund_desk`` (real work recorded as it happens) and ``relaykit eval
examples.refund_desk_v2 --query "RelayAgent = 'desk'" --limit 20 --report report.md``.
"""

from __future__ import annotations

import asyncio
import tempfile

from examples import refund_desk, refund_desk_v2
from relaykit import ModelSpec, Worker, connect, evaluate, start_run
from relaykit.devserver import DevServer
from relaykit.evals import EvalReport, EvalSource, markdown
from relaykit.testing.scripted_server import ScriptedModelServer


async def record_and_evaluate(
    address: str, model: ModelSpec, store: str, *, eval_id: str = "refund-desk-v2"
) -> EvalReport:
    """Record one run per order with the desk, then evaluate the changed desk on them."""
    client = await connect(address)
    async with Worker(
        client, refund_desk.desk, task_queue=f"{eval_id}-recorded", default_model=model, store=store
    ):
        handles = [
            await start_run(
                client, "desk", f"Order {n}: I was charged twice", task_queue=f"{eval_id}-recorded"
            )
            for n in range(1, 21)
        ]
        await asyncio.gather(*(handle.result() for handle in handles))
    return await evaluate(
        client,
        [refund_desk_v2.desk],
        [EvalSource(run_id=handle.id) for handle in handles],
        eval_id=eval_id,
        scorer=refund_desk_v2.score,
        default_model=model,
        store=store,
    )


def main() -> None:
    with (
        DevServer(port=0, headless=True, in_memory=True) as server,
        ScriptedModelServer(fallback=refund_desk.scripted_desk) as models,
        tempfile.TemporaryDirectory() as folder,
    ):
        model = ModelSpec(provider="openai", name="desk-model", base_url=f"{models.base_url}/v1")
        report = asyncio.run(record_and_evaluate(server.address, model, folder))
    print(markdown(report), end="")


if __name__ == "__main__":
    main()
