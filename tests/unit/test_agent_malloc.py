"""The agent's allocator settings: large output blocks come from the heap, not a fresh mmap each."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Allocates four 1 MiB blocks at once and frees them, as the agent does per output message
# (the read, the message, its encoding, gRPC's copy), from a second thread (the agent's RPC
# workers are threads), and prints the minor page faults that costs.
PROBE = textwrap.dedent("""
    import resource, sys, threading
    if sys.argv[1] == "tuned":
        from sandbox.__main__ import _tune_malloc
        _tune_malloc()

    def churn():
        for _ in range(3):  # warm up: the allocator settles on how it serves such blocks
            bytes(1 << 20)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(200):
            blocks = [bytearray(1 << 20) for _ in range(4)]
            for block in blocks:
                block[::4096] = b"x" * 256
            del blocks, block
        print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

    worker = threading.Thread(target=churn)
    worker.start()
    worker.join()
""")


def _faults(mode: str) -> int:
    run = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True)
    return int(run.stdout)


def test_one_mib_blocks_reuse_the_heap_instead_of_faulting_in_fresh_pages() -> None:
    untuned, tuned = _faults("plain"), _faults("tuned")
    # 800 blocks of 256 pages each: some 200,000 faults when freed blocks go back to the system.
    assert tuned < 2_000, f"{tuned} page faults for 800 reused 1 MiB blocks"
    assert untuned > 10 * max(tuned, 1), (untuned, tuned)
