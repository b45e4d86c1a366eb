"""models/kernel_caches.py: `specwise serve` bounds oneDNN's and ideep's per-shape caches unless told otherwise."""

import subprocess
import sys

from specwise.models.kernel_caches import CACHE_VARIABLES, KERNEL_CACHE_ENTRIES, bound_kernel_caches


def test_both_caches_get_the_bound_when_the_environment_is_silent():
    environ = {}
    assert bound_kernel_caches(environ=environ) == {name: str(KERNEL_CACHE_ENTRIES) for name in CACHE_VARIABLES}
    assert environ == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "128", "LRU_CACHE_CAPACITY": "128"}


def test_a_capacity_the_user_set_is_kept():
    environ = {"LRU_CACHE_CAPACITY": "4096"}
    assert bound_kernel_caches(64, environ) == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "4096"}


def test_the_bound_reaches_the_c_library_environment_the_kernels_read():
    # oneDNN and ideep read their capacity with getenv() when the first kernel runs: the bound must be in the
    # C environment of the process, not only in Python's os.environ
    code = ("import ctypes, os; from specwise.models.kernel_caches import bound_kernel_caches; "
            "bound_kernel_caches(); libc = ctypes.CDLL(None); libc.getenv.restype = ctypes.c_char_p; "
            "print(libc.getenv(b'ONEDNN_PRIMITIVE_CACHE_CAPACITY').decode(), libc.getenv(b'LRU_CACHE_CAPACITY').decode())")
    env = {"PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.split() == [str(KERNEL_CACHE_ENTRIES)] * 2
