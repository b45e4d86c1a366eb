"""`specwise evaluate` / `specwise report` flags and settings."""

import pytest

from specwise.bench.config import QUICK, EvaluateConfig
from specwise.cli import build_parser, main
from specwise.errors import ConfigError


def parse(*argv):
    return build_parser().parse_args(["evaluate", *argv])


def test_flags_come_from_the_settings_dataclasses(capsys):
    with pytest.raises(SystemExit):
        parse("--help")
    text = capsys.readouterr().out
    for flag in ("--methods", "--endpoint", "--concurrency", "--rate", "--burstiness", "--trace", "--time-scale",
                 "--slo", "--quick", "--skip-bad-rows", "--model", "--max-num-seqs", "--num-speculative-tokens"):
        assert flag in text
    assert "--speculative " not in text


def test_quick_fills_what_the_user_left_at_defaults():
    from specwise.cli_args import dataclass_from_args
    quick = dataclass_from_args(EvaluateConfig, parse("--quick"))
    assert (quick.concurrency, quick.per_category, quick.max_tokens, quick.duration) == (
        QUICK["concurrency"], QUICK["per_category"], QUICK["max_tokens"], QUICK["duration"])
    mine = dataclass_from_args(EvaluateConfig, parse("--quick", "--concurrency", "1,2", "--max-tokens", "8"))
    assert (mine.concurrency, mine.max_tokens, mine.per_category) == ("1,2", 8, QUICK["per_category"])
    assert EvaluateConfig(quick=True, rate="1,2").concurrency is None
    assert EvaluateConfig().concurrency == "1,2,4,8,16,32,64"
    assert EvaluateConfig(endpoint=["a=http://x"], concurrency="1")


@pytest.mark.parametrize("settings, message", [
    ({"concurrency": "1,x"}, "--concurrency: expected comma-separated integers"),
    ({"rate": "0"}, "--rate: values must be > 0"),
    ({"slo": "ttft=soon"}, "--slo ttft"),
    ({"api": "grpc"}, "--api must be one of"),
    ({"trace_category": "poetry"}, "--trace-category must be one of"),
    ({"pay_metric": "speed"}, "--pay-metric must be one of"),
    ({"duration": 0}, "--duration must be > 0"),
    ({"throughput_floor": 2}, "--throughput-floor"),
])
def test_invalid_settings_are_config_errors(settings, message):
    with pytest.raises(ConfigError, match=message):
        EvaluateConfig(**settings)


def test_errors_are_one_line_not_tracebacks(capsys, tmp_path):
    assert main(["evaluate", "--concurrency", "two"]) == 2
    assert capsys.readouterr().err.strip() == (
        "specwise: error: --concurrency: expected comma-separated integers, got 'two'")
    assert main(["evaluate", "--methods", "off,telepathy", "--output", str(tmp_path / "x")]) == 2
    assert "unknown speculative method 'telepathy'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    assert main(["evaluate", "--endpoint", "no-url-here"]) == 2
    assert "--endpoint: expected NAME=URL" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "no such file" in capsys.readouterr().err
