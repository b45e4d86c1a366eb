"""Where a server's resident memory goes: `specwise serve` with the allocator's own books read each minute.

    python benchmarks/memory_watch.py [specwise serve flags]     # soak.py --diagnose-memory runs this

A watcher thread writes one line every REPORT_S seconds to stderr:

    memory-watch: t=600s rss=2240.1MiB heap_in_use=812.3MiB heap_free=301.2MiB mmapped=640.0MiB
                  arenas=9 threads=14 trimmed=0.0MiB

from glibc's mallinfo2 (summed over every arena): heap_in_use (uordblks: live malloc'd bytes in the
arenas), heap_free (fordblks: freed bytes the allocator keeps), mmapped (hblkhd: blocks of at least
the mmap threshold, each returned to the kernel when freed), and the number of arenas (glibc gives a
thread its own arena when the others are busy, up to 8 per core). RSS that grows with heap_free is
the allocator keeping memory; with heap_in_use, something alive holds it. $MEMORY_WATCH_TRIM=1 calls
malloc_trim(0) after each reading and logs how much it gave back (the experiment: would returning
free memory keep RSS flat?). $MEMORY_WATCH_TRACEMALLOC=N also traces Python allocations and prints
the N source lines whose live memory grew most since the first report (slow: a diagnostic only).
Without glibc (musl, macOS) only rss and threads are printed. Diagnostic only: it adds a thread, so
its latencies are not the product's.
"""

import ctypes
import ctypes.util
import os
import sys
import tempfile
import threading
import time
import tracemalloc

REPORT_S = 60.0
MIB = 1024 * 1024


class MallInfo2(ctypes.Structure):
    """glibc's struct mallinfo2 (glibc >= 2.33): every field a size_t."""
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def glibc():
    """The C library if it is glibc with mallinfo2 and malloc_trim, else None."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.mallinfo2.restype = MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.fopen.restype = ctypes.c_void_p
        libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.fclose.argtypes = [ctypes.c_void_p]
        return libc
    except (OSError, AttributeError, TypeError):
        return None


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def arena_count(libc) -> int:
    """Arenas in use, from malloc_info's XML (one <heap nr=...> per arena), written to a temporary file."""
    with tempfile.NamedTemporaryFile("r") as xml:
        stream = libc.fopen(xml.name.encode(), b"w")
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        return xml.read().count("<heap nr=")


class MemoryWatch:
    def __init__(self, trim: bool, trace_lines: int):
        self.libc, self.trim, self.trace_lines = glibc(), trim, trace_lines
        self.started = time.monotonic()
        self.first_snapshot = None

    def start(self) -> None:
        if self.trace_lines:
            tracemalloc.start(1)
        threading.Thread(target=self.watch, name="memory-watch", daemon=True).start()

    def watch(self) -> None:
        while True:
            time.sleep(REPORT_S)
            self.report()

    def report(self) -> None:
        fields = [f"t={time.monotonic() - self.started:.0f}s", f"rss={rss_mib():.1f}MiB"]
        if self.libc is not None:
            info = self.libc.mallinfo2()
            fields += [f"heap_in_use={info.uordblks / MIB:.1f}MiB", f"heap_free={info.fordblks / MIB:.1f}MiB",
                       f"mmapped={info.hblkhd / MIB:.1f}MiB", f"arenas={arena_count(self.libc)}"]
        fields.append(f"threads={threading.active_count()}")
        if self.libc is not None and self.trim:
            before = rss_mib()
            self.libc.malloc_trim(0)
            fields.append(f"trimmed={before - rss_mib():.1f}MiB")
        lines = ["memory-watch: " + " ".join(fields)]
        if self.trace_lines:
            snapshot = tracemalloc.take_snapshot()
            if self.first_snapshot is None:
                self.first_snapshot = snapshot
            for stat in snapshot.compare_to(self.first_snapshot, "lineno")[:self.trace_lines]:
                lines.append(f"memory-watch:   {stat.size_diff / MIB:+8.2f} MiB  {stat.count_diff:+8d} blocks  "
                             f"{stat.traceback}")
        print("\n".join(lines), file=sys.stderr, flush=True)


if __name__ == "__main__":
    watch = MemoryWatch(trim=os.environ.get("MEMORY_WATCH_TRIM") == "1",
                        trace_lines=int(os.environ.get("MEMORY_WATCH_TRACEMALLOC", "0")))
    watch.start()
    from specwise.cli import main
    sys.exit(main(["serve", *sys.argv[1:]]))
