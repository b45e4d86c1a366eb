"""`make test` runs the tests marked `cpu_kernels` a second time held to AVX2 (see the Makefile). That second
run only protects an AVX2 machine if every kernel-, dtype- or compile-dependent test carries the mark, so a
test file that names one of those paths must carry it (on the file or on its tests)."""

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# What makes a test's outcome depend on the CPU: a reduced dtype, a weight-quantized kernel, compiling, the
# capability probe itself, or a stated need for one of them (capability_marks). (The calculators' "bf16" strings are names in a catalog, not kernels: not matched.)
KERNEL_WORDS = re.compile(r"torch\.bfloat16|quantiz|int8|int4|compile=True|--compile|capabilities|needs_cxx|"
                          r"needs_onednn_bf16|needs_onednn_fp32|needs_native_bf16")


def needs_mark_but_lacks_it(source: str) -> bool:
    return bool(KERNEL_WORDS.search(source)) and "cpu_kernels" not in source


def test_every_kernel_dependent_test_file_runs_again_held_to_avx2():
    unmarked = [path.name for path in sorted(TESTS.glob("test_*.py"))
                if path.name != Path(__file__).name and needs_mark_but_lacks_it(path.read_text())]
    assert not unmarked, f"mark the kernel-dependent tests in these files with capability_marks.cpu_kernels: {unmarked}"


def test_the_check_catches_what_it_looks_for():
    assert needs_mark_but_lacks_it("llm = LLM(model, dtype=torch.bfloat16)")
    assert needs_mark_but_lacks_it('main(["generate", "--compile"])')
    assert needs_mark_but_lacks_it("@needs_cxx\ndef test_compiles(): ...")
    assert not needs_mark_but_lacks_it("pytestmark = cpu_kernels\nllm = LLM(model, dtype=torch.bfloat16)")
    assert not needs_mark_but_lacks_it('DeploymentConfig(weight_dtype="bf16")')
