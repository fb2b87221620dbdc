"""The CLI keeps freed memory for reuse: a second model-sized tensor after the first was freed does not fault
its pages in again (glibc's default gives every large block back to the system on free)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import resource, sys, torch
from perm_core.malloc import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        blocks = [torch.ones(2**22, dtype=torch.float64) for _ in range(8)]  # 8 x 32 MiB, as a model's gradients
        del blocks
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults()
print(faults())
"""


def faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def test_freed_memory_is_reused_without_faulting_it_in_again():
    pages = 4 * 8 * 2**25 // 4096  # what four rounds of 256 MiB fault in when nothing is kept
    assert faults("default") > pages // 2  # the control: glibc's default gives it back each time
    assert faults("keep") < pages // 20
