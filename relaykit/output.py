"""Structured output: the JSON schema sent to the model, and validation of its final answer.

Providers want an object at the root of an output schema, so other types (``list[str]``, ``int``)
are wrapped as ``{"result": …}`` on the way out and unwrapped on the way back.

The schema reaches the model twice: as ``response_format`` (which several OpenAI-compatible
servers ignore) and, as lovia states it, briefly at the end of the system prompt
(:meth:`OutputType.instructions`), so a model behind any server sees it. An answer that does not
validate gets ``output_retries`` repair requests (lovia's default: one), then the run fails
with ``OutputValidationFailed`` (:func:`repairs_allowed`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import TypeAdapter, ValidationError

from relaykit.messages import OutputSpec

DEFAULT_OUTPUT_RETRIES = 1
"""lovia's: one repair request after an invalid structured answer."""
LEGACY_OUTPUT_RETRIES = 2
"""What runs started before ``output_retries`` existed keep."""


def repairs_allowed(setting_recorded: bool, run_override: int | None, agent_setting: int) -> int:
    """How many repair requests a run gives an agent's invalid structured answers: the run's
    override, else the agent's ``output_retries``; a run recorded before the setting existed
    keeps the two it started with."""
    if not setting_recorded:
        return LEGACY_OUTPUT_RETRIES
    return agent_setting if run_override is None else run_override


_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


class OutputType:
    """Wraps a Python type given as ``output_type``."""

    def __init__(self, tp: Any) -> None:
        self.type = tp
        self.adapter: TypeAdapter[Any] = TypeAdapter(tp)
        schema = self.adapter.json_schema()
        self.wrapped = schema.get("type") != "object"
        if self.wrapped:
            defs = schema.pop("$defs", None)
            schema = {"type": "object", "properties": {"result": schema}, "required": ["result"]}
            if defs:
                schema["$defs"] = defs
        self.schema = schema
        name = getattr(tp, "__name__", None) or "final_output"
        self.name = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]

    def instructions(self) -> str:
        """The system prompt's statement of the schema (short: the schema itself is the bulk)."""
        schema = json.dumps(self.schema, ensure_ascii=False, separators=(",", ":"))
        return (
            "## Output format\n"
            "Your final answer must be only a JSON document that matches this JSON Schema, "
            "with no text or code fences around it (call tools first if you need to):\n"
            f"{schema}"
        )

    @property
    def spec(self) -> OutputSpec:
        return OutputSpec(name=self.name, json_schema=self.schema)

    def parse(self, text: str) -> Any:
        """Validate the model's final text; ``ValueError`` carries a message for the model."""
        match = _FENCE.match(text)
        raw = match.group(1) if match else text.strip()
        try:
            if self.wrapped:
                envelope = TypeAdapter(dict[str, Any]).validate_json(raw)
                if "result" not in envelope:
                    raise ValueError('the answer must be a JSON object with a "result" field')
                return self.adapter.validate_python(envelope["result"])
            return self.adapter.validate_json(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'answer'}: {err['msg']}"
                for err in exc.errors(include_url=False)
            )
            raise ValueError(problems) from None

    def dump(self, value: Any) -> Any:
        """The JSON-compatible form stored in the run's result."""
        return self.adapter.dump_python(value, mode="json")
