"""Which grammar a request asks for: response_format, vLLM's guided_* fields, or forced tool calls.

  response_format {"type": "text"}                          -> none
  response_format {"type": "json_object"}                   -> any JSON object
  response_format {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}
                                                            -> that schema
  guided_json / guided_regex / guided_choice / guided_grammar (vLLM) -> schema / regex / choice / Lark
  tool_choice "required" or {"type": "function", ...}       -> the tool-call grammar (tools.py)

At most one of them per request. The grammar itself is compiled by the engine
(`engine/sampling/grammar.py`); a schema or grammar it cannot compile is a 400 naming the problem.
"""

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from specwise.sampling_params import StructuredOutput
from specwise.server.errors import APIError

MAX_SCHEMA_BYTES = 64 * 1024


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | bool | None = None
    strict: bool | None = None

    def __init__(self, **data):
        if "schema" in data:
            data["json_schema"] = data.pop("schema")
        super().__init__(**data)


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


def structured_output(request) -> StructuredOutput | None:
    """The request's one grammar (see the module docstring), or None."""
    asked = []
    response_format = request.response_format
    if response_format is not None and response_format.type == "json_object":
        asked.append(("response_format", StructuredOutput("json_object")))
    elif response_format is not None and response_format.type == "json_schema":
        if response_format.json_schema is None or response_format.json_schema.json_schema is None:
            raise APIError(400, "response_format json_schema needs json_schema.schema", "response_format.json_schema",
                           "invalid_value")
        asked.append(("response_format", schema_output(response_format.json_schema.json_schema,
                                                       "response_format.json_schema.schema")))
    if request.guided_json is not None:
        schema = request.guided_json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as error:
                raise APIError(400, f"guided_json is not valid JSON: {error}", "guided_json", "invalid_value") from None
        asked.append(("guided_json", schema_output(schema, "guided_json")))
    if request.guided_regex is not None:
        asked.append(("guided_regex", StructuredOutput("regex", request.guided_regex)))
    if request.guided_choice is not None:
        asked.append(("guided_choice", StructuredOutput("choice", json.dumps(request.guided_choice))))
    if request.guided_grammar is not None:
        asked.append(("guided_grammar", StructuredOutput("lark", request.guided_grammar)))
    tools = request.tool_choice_info() if hasattr(request, "tool_choice_info") else None
    if tools is not None and tools.grammar is not None:
        asked.append(("tool_choice", tools.grammar))
    if len(asked) > 1:
        raise APIError(400, f"only one structured-output constraint per request, got {', '.join(n for n, _ in asked)}",
                       asked[1][0], "invalid_value")
    return asked[0][1] if asked else None


def schema_output(schema, param: str) -> StructuredOutput:
    if not isinstance(schema, (dict, bool)):
        raise APIError(400, "a JSON schema must be an object", param, "invalid_value")
    text = json.dumps(schema)
    if len(text) > MAX_SCHEMA_BYTES:
        raise APIError(400, f"the JSON schema is {len(text)} bytes; the limit is {MAX_SCHEMA_BYTES}", param,
                       "grammar_too_large")
    return StructuredOutput("json", text)

