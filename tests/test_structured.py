"""Structured output in the engine: grammar masks in the sampler and the verifier.

  - greedy with a JSON schema is token-identical with and without each drafter, and drafting
    happened (forced tokens are proposed as free drafts and accepted);
  - no draft the grammar rejects ever reaches verification (truncated at proposal time);
  - every output parses and validates against its schema (nested objects, arrays, enums,
    numbers, a regex, a choice), greedy and sampled; strings are bounded (maxLength) and numbers
    are bounded integers or enums because a random tiny model would otherwise write digits or
    characters forever (the real model gets free-form schemas in tests/test_structured_server.py);
  - bad grammars are an InputError naming the problem.
"""

import json

import jsonschema
import pytest
from test_penalties import drafting_engine
from test_spec_exactness import ENGINE, models, run  # noqa: F401

from specwise.config import EngineConfig
from specwise.engine.llm_engine import LLMEngine
from specwise.engine.spec_decode import grammar_drafts
from specwise.errors import InputError
from specwise.sampling_params import SamplingParams, StructuredOutput

NAME = {"type": "string", "maxLength": 6}
SCHEMAS = {
    "flat": {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
             "required": ["name", "age"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"name": NAME, "admin": {"type": "boolean"}},
                 "required": ["name", "admin"], "additionalProperties": False},
        "scores": {"type": "array", "items": {"type": "integer", "minimum": -10, "maximum": 10}, "maxItems": 3}},
        "required": ["user", "scores"], "additionalProperties": False},
    "enum_array": {"type": "object", "properties": {
        "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 4},
        "size": {"enum": ["S", "M", "L"]}, "ratio": {"type": "number", "enum": [0.25, 1.5, 10]}},
        "required": ["colors", "size", "ratio"], "additionalProperties": False},
}
PROMPT = "Answer in JSON: {\"name\": \"Ada\", \"age\": 36} and {\"user\": {\"name\": \"Bob\"}}"


def json_params(schema: dict, **settings) -> SamplingParams:
    return SamplingParams(structured_output=StructuredOutput("json", json.dumps(schema)),
                          **{"temperature": 0, "max_tokens": 300, **settings})


def outputs_of(engine: LLMEngine, params_by_id: dict) -> dict:
    steps = run(engine, [(0, request_id, PROMPT, params) for request_id, params in params_by_id.items()])
    return {request_id: outputs[-1] for request_id, outputs in steps.items()}


@pytest.fixture(scope="module")
def plain(models):  # noqa: F811
    engine = LLMEngine(EngineConfig(**ENGINE), models[0])
    return outputs_of(engine, {name: json_params(schema) for name, schema in SCHEMAS.items()})


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_greedy_json_output_validates(plain, name):
    output = plain[name]
    assert output.finish_reason == "stop", output.text
    jsonschema.validate(json.loads(output.text), SCHEMAS[name])


@pytest.mark.parametrize("drafter", ["ngram", "draft_same", "layer_skip", "lookahead"])
def test_greedy_json_is_token_identical_under_speculation(models, plain, drafter, monkeypatch):  # noqa: F811
    checked = []
    fit = grammar_drafts.fit_to_grammars

    def checking_fit(proposal, seqs, budgets, processing):
        fitted = fit(proposal, seqs, budgets, processing)
        for row, (seq, drafts) in enumerate(zip(seqs, fitted.draft_token_ids)):
            matcher, tree = processing.matcher(seq), fitted.tree(row)
            paths = [drafts] if tree is None else [tree.path_tokens(leaf) for leaf in tree.leaves()]
            if matcher is not None:
                for path in paths:
                    assert matcher.valid_prefix(path) == len(path), "a draft outside the grammar was verified"
                checked.append(sum(map(len, paths)))
        return fitted
    monkeypatch.setattr("specwise.engine.llm_engine.fit_to_grammars", checking_fit)
    engine = drafting_engine(models, drafter, k=4)
    speculative = outputs_of(engine, {name: json_params(schema) for name, schema in SCHEMAS.items()})
    for name in SCHEMAS:
        assert speculative[name].output_token_ids == plain[name].output_token_ids, name
    assert sum(checked) > 0 and engine.stats.accepted_tokens > 0


def test_forced_tokens_are_free_drafts(models):  # noqa: F811
    """Without any drafter of its own worth the name (n-gram on a prompt with nothing to copy),
    the keys and punctuation a schema forces are drafted and accepted."""
    engine = LLMEngine(EngineConfig(speculative="ngram:4-4", num_speculative_tokens=4, **ENGINE), models[0])
    output = outputs_of(engine, {"r": json_params(SCHEMAS["nested"])})["r"]
    jsonschema.validate(json.loads(output.text), SCHEMAS["nested"])
    assert engine.stats.accepted_tokens >= 10


@pytest.mark.parametrize("drafter", [None, "ngram"])
def test_sampled_outputs_validate(models, drafter):  # noqa: F811
    config = EngineConfig(**ENGINE) if drafter is None else EngineConfig(speculative="ngram:1-3",
                                                                         num_speculative_tokens=3, **ENGINE)
    engine = LLMEngine(config, models[0])
    params = {f"{name}-{seed}": json_params(schema, temperature=0.8, seed=seed, max_tokens=300)
              for name, schema in SCHEMAS.items() for seed in range(3)}
    params["regex"] = SamplingParams(temperature=1.0, seed=1, max_tokens=50,
                                     structured_output=StructuredOutput("regex", r"\d{3}-[a-z]{2,4}"))
    params["choice"] = SamplingParams(temperature=1.0, seed=2, max_tokens=50,
                                      structured_output=StructuredOutput("choice", json.dumps(["yes", "no"])))
    outputs = outputs_of(engine, params)
    for request_id, output in outputs.items():
        name = request_id.rpartition("-")[0]
        if name in SCHEMAS:
            jsonschema.validate(json.loads(output.text), SCHEMAS[name])
    import re
    assert re.fullmatch(r"\d{3}-[a-z]{2,4}", outputs["regex"].text)
    assert outputs["choice"].text in ("yes", "no")


@pytest.mark.parametrize("spec, words", [
    (StructuredOutput("json", "{not json"), "json"),
    (StructuredOutput("json", json.dumps({"type": "object", "properties": 5})), "properties"),
    (StructuredOutput("json", json.dumps({"type": "strin"})), "strin"),
    (StructuredOutput("json", json.dumps({"type": "string", "format": "no-such-format"})), "format"),
    (StructuredOutput("regex", "(["), "regex"),
    (StructuredOutput("lark", "start: nope"), "nope"),
])
def test_bad_grammars_are_input_errors(models, spec, words):  # noqa: F811
    engine = LLMEngine(EngineConfig(**ENGINE), models[0])
    with pytest.raises(InputError, match=words):
        engine.add_request("x", SamplingParams(structured_output=spec))
    assert not engine.has_unfinished()
