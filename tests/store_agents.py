"""An agent for the shared-store tests, served by worker processes of their own
(``python -m relaykit.cli worker tests.store_agents``) that share nothing but an S3 endpoint.

``STORE_MODEL_URL`` and ``STORE_MODEL_NAME`` (read at import) name the test's scripted model.
"""

from __future__ import annotations

import os
from datetime import timedelta

from temporalio.common import RetryPolicy

from relaykit import Agent, ModelSpec, tool


@tool(retry=RetryPolicy(initial_interval=timedelta(milliseconds=200)))
def step(n: int) -> str:
    """Do one step of the job.

    Args:
        n: The step's number.
    """
    return f"step {n} done"


store_agent = Agent(
    name="store_agent",
    instructions="Take the steps, then answer.",
    model=ModelSpec(
        provider="openai",
        name=os.environ.get("STORE_MODEL_NAME", "store-model"),
        base_url=f"{os.environ.get('STORE_MODEL_URL', 'http://127.0.0.1:9')}/v1",
    ),
    tools=[step],
)
