"""Where `--compile`'s graphs are kept between starts: one directory per model and machine setting.

inductor's own disk cache cannot keep them: freezing packs the bf16 linears' weights for oneDNN,
and its FX graph cache refuses a graph holding those tensors ("mkldnn tensors unpickleable"), so
every start compiled in full. An AOTInductor package (`torch._inductor.aoti_compile_and_package`)
holds a graph's compiled code and its frozen constants, oneDNN's packed weights included, in one
file that loads in a fraction of a second (models/compile/graphs.py builds and loads them).

An entry is a directory named by a digest of everything its graphs depend on (`entry_key`): the
model's weights (after loading and packing), the dtype, the code that defines the forward, the
compiled graphs' token buckets, torch's version, the CPU's instruction set and bf16 support, and
the thread count the kernels were generated for (inductor writes it into them). Its `key.json`
repeats the key; an entry whose key.json differs (copied from elsewhere, half written) is emptied
and rebuilt. Each package has its SHA-1 beside it, checked before it is loaded: a package with a
few bytes flipped loaded without complaint and crashed the process when run (1.9 s for the default
model's 1.3 GB on the busy 2-core VM; a bad header alone the loader catches). A graph that fails the check,
does not load or does not run is compiled again; each with a one-line note.

Location: $SPECWISE_COMPILE_CACHE, else compiled/ in the specwise cache directory ($SPECWISE_CACHE
or ~/.cache/specwise). SPECWISE_COMPILE_CACHE=off keeps nothing (a temporary directory per start).
"""

import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from specwise.models import attention, capabilities, llama, quantize, rope
from specwise.models.checkpoints.default_model import cache_dir

ENV = "SPECWISE_COMPILE_CACHE"
KEEP_ENTRIES = 4        # the most recently used entries kept; a default-model entry is ~1.5 GB
FORMAT = 1              # bumped when what an entry holds changes shape


def cache_root() -> Path | None:
    """The directory holding the entries; None when caching is off."""
    setting = os.environ.get(ENV)
    if setting is not None and setting.strip().lower() in ("off", "none", "0"):
        return None
    return Path(setting).expanduser() if setting else cache_dir() / "compiled"


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of every tensor the forward reads: parameters, buffers and plain tensor attributes (a packed
    layer's bias), by name, dtype, shape and bytes. ~0.5 s for the default model's 270 MB."""
    digest = hashlib.sha256()
    for module_name, module in model.named_modules():
        tensors = {**dict(module.named_parameters(recurse=False)), **dict(module.named_buffers(recurse=False)),
                   **{name: value for name, value in vars(module).items() if isinstance(value, torch.Tensor)}}
        for name, tensor in sorted(tensors.items()):
            if tensor.is_mkldnn:
                tensor = tensor.to_dense()
            digest.update(f"{module_name}.{name} {tensor.dtype} {tuple(tensor.shape)}\n".encode())
            digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@functools.cache
def source_digest(module) -> str:
    """SHA-256 of a module's source file, read once: the code that runs, even if the file is edited later."""
    return hashlib.sha256(Path(module.__file__).read_bytes()).hexdigest()


# the files that define the compiled forward, as imported: editing them invalidates every entry
FORWARD_SOURCES = [source_digest(module) for module in (attention, llama, quantize, rope)]


def code_digest(*modules) -> str:
    """The forward's sources and those of `modules` (whoever compiles it) in one digest."""
    sources = FORWARD_SOURCES + [source_digest(module) for module in modules]
    return hashlib.sha256(" ".join(sources).encode()).hexdigest()


def entry_key(model: torch.nn.Module, dtype: torch.dtype, buckets: tuple[int, ...], *code_modules) -> dict:
    """Everything a compiled graph depends on. The quantization is in the weights' dtypes and the layers' kinds."""
    return {
        "format": FORMAT,
        "weights": weights_digest(model),
        "layers": sorted({type(module).__name__ for module in model.modules()}),
        "dtype": str(dtype),
        "code": code_digest(*code_modules),
        "buckets": list(buckets),
        "torch": torch.__version__,
        "cpu": capabilities.cpu_capabilities().to_dict(),      # ISA, and which kernels run (capabilities.py)
        "threads": torch.get_num_threads(),
    }


def note(message: str) -> None:
    print(f"specwise: {message}", file=sys.stderr, flush=True)


class CompileCache:
    """One entry's directory: `path(name)` is where graph `name`'s package lives, written by `store`."""

    def __init__(self, key: dict):
        self.key = key
        root = cache_root()
        self.kept = root is not None
        if self.kept:
            try:
                self.directory = self._open(root, key)
                return
            except OSError as error:
                note(f"cannot use the compile cache in {root} ({error}); compiling without it")
                self.kept = False
        self._scratch = tempfile.TemporaryDirectory(prefix="specwise-compile-")
        self.directory = Path(self._scratch.name)

    def _open(self, root: Path, key: dict) -> Path:
        text = _key_text(key)
        directory = entry_directory(root, key)
        manifest = directory / "key.json"
        if directory.is_dir() and (not manifest.is_file() or manifest.read_text() != text):
            note(f"the compile cache entry {directory} was made for other settings; compiling it again")
            shutil.rmtree(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if not manifest.is_file():
            _write_atomically(manifest, text.encode())
        os.utime(manifest)          # most recently used: the last to be pruned
        _prune(root, keep=directory)
        return directory

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.pt2"

    def store(self, name: str, build) -> Path:
        """build(path) writes graph `name`'s package at path; it is moved in place only once complete, then
        its checksum is written (a package without one is not used)."""
        target = self.path(name)
        handle, scratch = tempfile.mkstemp(dir=self.directory, prefix=f".{name}-", suffix=".pt2")
        os.close(handle)
        try:
            build(scratch)
            digest = _sha1(Path(scratch))
            os.replace(scratch, target)
        finally:
            if os.path.exists(scratch):
                os.unlink(scratch)
        _write_atomically(self._checksum_path(name), digest.encode())
        return target

    def verify(self, name: str) -> None:
        """ValueError unless graph `name`'s package has the checksum stored with it."""
        checksum = self._checksum_path(name)
        if not checksum.is_file():
            raise ValueError("no checksum stored with it")
        if _sha1(self.path(name)) != checksum.read_text().strip():
            raise ValueError("its checksum does not match")

    def discard(self, name: str) -> None:
        self.path(name).unlink(missing_ok=True)
        self._checksum_path(name).unlink(missing_ok=True)

    def _checksum_path(self, name: str) -> Path:
        return self.directory / f"{name}.pt2.sha1"


def _key_text(key: dict) -> str:
    return json.dumps(key, indent=1, sort_keys=True) + "\n"


def entry_directory(root: Path, key: dict) -> Path:
    """Where the entry for key lives under root (it may not exist)."""
    return root / hashlib.sha256(_key_text(key).encode()).hexdigest()[:24]


def holds(key: dict, names: list[str]) -> bool:
    """Whether the cache already holds every named graph for key, each with its checksum, creating and pruning
    nothing (the checksums themselves are checked when the packages load)."""
    root = cache_root()
    if root is None:
        return False
    directory = entry_directory(root, key)
    manifest = directory / "key.json"
    try:
        if not manifest.is_file() or manifest.read_text() != _key_text(key):
            return False
    except OSError:
        return False
    return all((directory / f"{name}.pt2").is_file() and (directory / f"{name}.pt2.sha1").is_file()
               for name in names)


def _sha1(path: Path) -> str:
    with open(path, "rb") as stream:
        return hashlib.file_digest(stream, "sha1").hexdigest()


def _write_atomically(path: Path, data: bytes) -> None:
    handle, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(handle, "wb") as stream:
        stream.write(data)
    os.replace(scratch, path)


def _prune(root: Path, keep: Path) -> None:
    """Remove all but the KEEP_ENTRIES most recently used entries (keep among them)."""
    entries = [path for path in root.iterdir() if path.is_dir() and path != keep]

    def last_used(path: Path) -> float:
        manifest = path / "key.json"
        return manifest.stat().st_mtime if manifest.is_file() else 0.0

    for stale in sorted(entries, key=last_used, reverse=True)[KEEP_ENTRIES - 1:]:
        shutil.rmtree(stale, ignore_errors=True)
