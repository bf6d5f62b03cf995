"""The quick-start demo: a travel assistant that needs several tool calls to answer.

Run it with ``relaykit demo`` (embedded Temporal server, worker processes and a run in one
command; the demo kills its first worker mid-run to show the run survive it) or serve it with
``relaykit worker examples.demo`` and start runs with ``relaykit run travel_assistant "…" --wait``.
With no model configured, :func:`scripted_demo` plays the model (deterministic: the same calls
and answer every time); ``relaykit demo --model openai:gpt-4.1`` uses a real one, and
``--model local`` the bundled tiny model, whose answers are often wrong.

The tools answer from small built-in tables so the demo works offline; swap them for real APIs.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from relaykit import Agent, ModelSettings, tool
from relaykit.testing.scripted_server import ScriptedRequest, Step, call, text

_WEATHER = {
    "paris": "14°C, light rain in the morning, clearing in the afternoon",
    "tokyo": "19°C, sunny, light wind",
    "lisbon": "21°C, sunny",
    "new york": "9°C, overcast",
}
_RATES_TO_EUR = {"EUR": 1.0, "USD": 0.92, "JPY": 0.0061, "GBP": 1.17}


City = Annotated[str, Field(max_length=40)]
Currency = Literal["EUR", "USD", "JPY", "GBP"]


@tool(effect="read")
def get_weather(cities: Annotated[list[City], Field(max_length=5)]) -> str:
    """Get the weather forecast for the cities of a trip.

    Args:
        cities: Every city of the trip, e.g. ["Lisbon", "New York"].
    """
    # One call for all cities: a small model asked for one city at a time looked up the first
    # city again and again and never the second.
    return (
        "; ".join(
            f"{city}: {_WEATHER.get(city.strip().lower(), 'no forecast available')}"
            for city in cities
        )
        or "no city given"
    )


@tool(effect="read")
def convert_currency(amount: float, from_currency: Currency, to_currency: Currency) -> str:
    """Convert an amount between currencies (EUR, USD, JPY, GBP).

    Args:
        amount: How much money.
        from_currency: ISO code of the currency the amount is in.
        to_currency: ISO code of the currency wanted.
    """
    src, dst = from_currency.upper(), to_currency.upper()
    if src not in _RATES_TO_EUR or dst not in _RATES_TO_EUR:
        raise ValueError(f"unsupported currency pair {src}->{dst}")
    converted = amount * _RATES_TO_EUR[src] / _RATES_TO_EUR[dst]
    return f"{amount:.2f} {src} = {converted:.2f} {dst}"


travel_assistant = Agent(
    name="travel_assistant",
    description="Plans trips: weather and money.",
    instructions=(
        "You help people prepare trips. Use get_weather with every city mentioned and "
        "convert_currency for money questions, then answer in a few short sentences."
    ),
    tools=[get_weather, convert_currency],
    # Short, sober answers; a first turn that must use a tool, so even the tiny offline model
    # starts by looking things up; an answer after two tool turns; no identical call twice.
    model_settings=ModelSettings(temperature=0, max_tokens=150, first_turn_tool_choice="required"),
    answer_after_tool_turns=2,
    max_repeated_calls=1,
)

# The request names the conversion the way the tool's arguments do ("500 EUR to JPY"): asked
# "how much is my cash in JPY?", the bundled 135M model converted to USD.
DEMO_PROMPT = (
    "I fly to Paris and then Tokyo next week. Convert my 500 EUR cash to JPY, and tell me "
    "what weather to pack for in Paris and in Tokyo."
)


def scripted_demo(request: ScriptedRequest) -> Step:
    """A scripted stand-in for a model, used when no model is configured: it calls the tools
    the way a good model would, so the demo shows a real multi-step durable run."""
    results = request.tool_results
    if not results:
        return call("get_weather", cities=["Paris", "Tokyo"])
    if len(results) == 1:
        return call("convert_currency", amount=500, from_currency="EUR", to_currency="JPY")
    weather = "\n".join(f"- {city}" for city in results[0].split("; "))
    return text(
        f"Weather to pack for:\n{weather}\nTake layers and a rain jacket for Paris.\n"
        f"Your cash: {results[1]}."
    )
