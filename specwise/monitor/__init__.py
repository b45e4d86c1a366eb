"""Acceptance in production and before it.

`specwise monitor`: scrape vLLM, SGLang or our own server's /metrics, turn the speculative
counters into per-window acceptance figures, detect drift against a baseline, warn when
concurrency sits above the break-even, alert (dashboard, JSONL log, webhook, exit code).
`specwise estimate`: from logged prompts and completions, the acceptance a drafter would get
on that traffic, and the speedup it would bring through the calculators.
See docs/monitor.md.
"""
