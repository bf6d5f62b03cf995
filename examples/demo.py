"""The quick-start demo: a travel assistant that needs several tool calls to answer.

Run it with ``relaykit demo`` (embedded Temporal server, worker and run in one command) or serve it
with ``relaykit worker examples.demo`` and start runs with
``relaykit run travel_assistant "…" --wait``.

The tools answer from small built-in tables so the demo works offline; swap them for real APIs.
"""

from __future__ import annotations

from relaykit import Agent, ModelSettings, tool
from relaykit.testing.scripted_server import ScriptedRequest, Step, batch, call, text

_WEATHER = {
    "paris": "14°C, light rain in the morning, clearing in the afternoon",
    "tokyo": "19°C, sunny, light wind",
    "lisbon": "21°C, sunny",
    "new york": "9°C, overcast",
}
_RATES_TO_EUR = {"EUR": 1.0, "USD": 0.92, "JPY": 0.0061, "GBP": 1.17}


@tool
def get_weather(city: str) -> str:
    """Get the weather forecast for a city.

    Args:
        city: The city, e.g. "Paris".
    """
    return _WEATHER.get(city.strip().lower(), f"no forecast available for {city}")


@tool
def convert_currency(amount: float, from_currency: str, to_currency: str) -> str:
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
        "You help people prepare trips. Use get_weather for every city mentioned and "
        "convert_currency for money questions, then answer in a few short sentences."
    ),
    tools=[get_weather, convert_currency],
    # Short, sober answers; and a first turn that must use a tool, so even the tiny offline
    # model starts by looking things up.
    model_settings=ModelSettings(temperature=0, max_tokens=300, first_turn_tool_choice="required"),
)

DEMO_PROMPT = (
    "I'm flying to Paris and then Tokyo next week with 500 EUR in cash. "
    "What weather should I pack for, and how much is my cash in JPY?"
)


def scripted_demo(request: ScriptedRequest) -> Step:
    """A scripted stand-in for a model, used when no model is configured: it calls the tools
    the way a good model would, so the demo shows a real multi-step durable run."""
    results = request.tool_results
    if not results:
        return batch(call("get_weather", city="Paris"), call("get_weather", city="Tokyo"))
    if len(results) == 2:
        return call("convert_currency", amount=500, from_currency="EUR", to_currency="JPY")
    return text(
        f"Paris: {results[0]}. Tokyo: {results[1]}. Pack layers and a rain jacket. "
        f"Your cash: {results[2]}."
    )
