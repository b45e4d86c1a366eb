"""What a test needs from the machine, stated as a mark that skips it (with the reason) where it is missing,
and a way to pretend a capability is missing so each fallback is tested on any machine."""

import shutil

import pytest

from specwise.models import capabilities

_caps = capabilities.cpu_capabilities()

needs_onednn_fp32 = pytest.mark.skipif(not _caps.onednn_fp32,
                                       reason=f"needs {capabilities.NEEDS['onednn_fp32']}; this CPU: {_caps.isa}")
needs_onednn_bf16 = pytest.mark.skipif(not _caps.onednn_bf16,
                                       reason=f"needs {capabilities.NEEDS['onednn_bf16']}; this CPU: {_caps.isa}")
needs_native_bf16 = pytest.mark.skipif(not _caps.native_bf16,
                                       reason=f"needs native bf16 instructions; this CPU: {_caps.isa}")
# A test whose outcome depends on the CPU's kernels, dtype choice or compiler. `make test` runs these a second
# time held to AVX2 (no AVX-512, no native bf16) on a CPU that has more; tests/test_markers.py checks that a
# file naming a kernel, a reduced dtype or compiling carries it.
cpu_kernels = pytest.mark.cpu_kernels
needs_cxx = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("clang++") is None,
                               reason="needs a C++ compiler (g++ or clang++) for inductor")


def pretend_missing(monkeypatch, *names: str) -> None:
    """This test's CPU reports the named capabilities (Capabilities fields) missing; the one-time notes reset."""
    missing = capabilities.Capabilities(**dict(_caps.to_dict(), **{name: False for name in names},
                                               native_bf16=_caps.native_bf16 and "onednn_bf16" not in names))
    monkeypatch.setattr(capabilities, "cpu_capabilities", lambda: missing)
    capabilities.note_fallback.cache_clear()
