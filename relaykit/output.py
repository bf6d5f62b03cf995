"""Structured output: the JSON schema sent to the model, and validation of its final answer.

Providers want an object at the root of an output schema, so other types (``list[str]``, ``int``)
are wrapped as ``{"result": …}`` on the way out and unwrapped on the way back.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import TypeAdapter, ValidationError

from relaykit.messages import OutputSpec

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
