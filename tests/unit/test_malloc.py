"""The CLI keeps freed memory for reuse: a second model-sized tensor after the first was freed does not fault
its pages in again (glibc's default gives every large block back to the system on free)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import resource, sys, torch
from perm_core.run.malloc import keep_freed_memory
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


SERVER_PROBE = """
import sys, torch
from perm_core.run.malloc import give_freed_memory_back
if sys.argv[1] == "server":
    assert give_freed_memory_back()
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
warm = torch.ones(2**20)  # 4 MiB: glibc's default raises its threshold above it when it is freed
del warm
before = resident()
blocks, kept = [], []
for _ in range(64):
    blocks.append(torch.ones(2**19))  # 2 MiB each: a trace's tensors
    # 64 KiB blocks between them, still alive: each from the heap's top, where no freed chunk can serve it first
    kept.append(torch.ones(2**14))
del blocks
print((resident() - before) / 2**20)
"""


def resident_after_free_mib(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", SERVER_PROBE, mode], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def test_the_server_gives_freed_large_blocks_back():
    """128 MiB of 2 MiB blocks freed among live 64 KiB ones (4 MiB, which stay): glibc's default keeps them
    resident (the control); the app's setting returns them."""
    assert resident_after_free_mib("default") > 100
    assert resident_after_free_mib("server") < 16
