"""An agent for the fleet tests, served by worker processes of their own
(``python -m relaykit.cli worker tests.fleet_agents``): ``FLEET_MODEL_URL`` and
``FLEET_MODEL_NAME`` name the test's scripted model."""

from __future__ import annotations

import os

from relaykit import Agent, ModelSpec

fleet_agent = Agent(
    name="fleet_agent",
    instructions="Answer.",
    model=ModelSpec(
        provider="openai",
        name=os.environ.get("FLEET_MODEL_NAME", "fleet"),
        base_url=f"{os.environ.get('FLEET_MODEL_URL', 'http://127.0.0.1:9')}/v1",
    ),
)
