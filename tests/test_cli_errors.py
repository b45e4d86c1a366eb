"""`specwise generate` with bad input: exit status 2 and one `specwise: error: ...` line, never a traceback."""

import pytest

from specwise.cli import main
from specwise.models.capabilities import compute_dtype, describe_kernels
from capability_marks import cpu_kernels
from tiny_checkpoints import make_tiny_hf_config, random_state_dict, write_hf_checkpoint

pytestmark = cpu_kernels

SMALL = ["--num-kv-blocks", "32", "--max-model-len", "64", "--max-num-batched-tokens", "64"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    hf_config = make_tiny_hf_config()
    return str(write_hf_checkpoint(tmp_path_factory.mktemp("tiny"), hf_config, random_state_dict(hf_config)))


def run(capsys, *argv) -> tuple[int, str, str]:
    status = main(["generate", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def the_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{err}"
    assert lines[0].startswith("specwise: error: ") and "Traceback" not in err
    return lines[0]


def test_good_flags_generate(capsys, model_dir):
    # the error cases below use this same model and command
    status, out, err = run(capsys, "--model", model_dir, "--prompt", "hi", "--max-tokens", "4",
                           "--temperature", "0", *SMALL)
    assert status == 0 and "4 tokens in" in err
    # the start-up line names the dtype and kernel path that ran
    dtype = compute_dtype("auto", "cpu")
    assert f"specwise: engine: {describe_kernels(dtype, 'none', 'cpu')}, eager\n" in err


def test_missing_model_path(capsys, tmp_path):
    missing = tmp_path / "no-such-model"
    status, _, err = run(capsys, "--model", str(missing), "--prompt", "hi")
    assert status == 2
    line = the_error_line(err)
    assert str(missing) in line and "no such file or directory" in line


@pytest.mark.parametrize("flag, value, fragment", [
    ("--max-num-seqs", "0", "max_num_seqs must be >= 1"),
    ("--block-size", "-4", "block_size must be >= 1"),
    ("--dtype", "fp8", "dtype must be one of"),
    ("--num-speculative-tokens", "99", "num_speculative_tokens"),
])
def test_bad_engine_flag_values(capsys, tmp_path, flag, value, fragment):
    # refused before the model is even looked at
    status, _, err = run(capsys, "--model", str(tmp_path / "unused"), "--prompt", "hi", flag, value)
    assert status == 2 and fragment in the_error_line(err)


@pytest.mark.parametrize("argv, fragment", [
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--top-p", "1.5"], "top_p must be in (0, 1]"),
    (["--max-tokens", "0"], "max_tokens must be >= 1"),
    (["--speculative", "magic"], "unknown speculative method 'magic'"),
    (["--speculative", "lookahead:4,9,4"], "lookahead:W,N,G needs N (n-gram size) in 2..6, got 9"),
    (["--prompt", ""], "the prompt is empty"),
])
def test_bad_request_flag_values(capsys, model_dir, argv, fragment):
    prompt = [] if "--prompt" in argv else ["--prompt", "hi"]
    status, _, err = run(capsys, "--model", model_dir, *prompt, *argv, *SMALL)
    assert status == 2 and fragment in the_error_line(err)


def test_a_value_of_the_wrong_type_is_an_argparse_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "--prompt", "hi", "--max-num-seqs", "many"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert "invalid int value: 'many'" in err.strip().splitlines()[-1] and "Traceback" not in err
