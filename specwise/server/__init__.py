"""OpenAI-compatible HTTP server over the engine seam (`specwise serve`, or `create_app(async_engine, config)`).

Routes: POST /v1/completions, POST /v1/chat/completions (streamed as server-sent events
ending in `data: [DONE]`, or not), GET /v1/models, GET /health, GET /metrics (Prometheus).

Beyond the OpenAI fields: vLLM's (`top_k`, `ignore_eos`, `stop_token_ids`, `min_tokens`,
`repetition_penalty`, `guided_*`, ...) and `speculative: false` to decode one request without
drafts (docs/server.md has the whole list). Every answer
carries a `specwise` object with that request's drafts, draft tokens, accepted tokens,
accepted per position, acceptance rate and mean acceptance length (streamed: in the chunk
with finish_reason).

Files: config (ServerConfig), protocol (request bodies), responses (answer bodies),
generation (admission and one request's run), streaming (answering, SSE, disconnects),
logprobs (their two OpenAI shapes), structured (response_format, guided_*), tools (tool_choice,
tool_calls), tool_prompt (tools for templates without tool support), tool_stream (tool calls
read while they stream), metrics (Prometheus), errors (OpenAI-style error bodies), app
(routes), cli (`specwise serve`).
"""
