"""Where a broker's event loop stalls, when py-spy is not at hand: runs `broker` in this
process, timing each pass of its event loop and sampling the Python stack of a long one.

    .venv/bin/python bench/loopwatch.py OUT.jsonl run --set KEY=VALUE ...

A pass of asyncio's loop runs every callback that is ready between two waits in the
selector; a message that arrives meanwhile waits for the pass to end. The selector's
`select` is wrapped (in this process only) to note when the main thread leaves it and
enters it again: a pass of at least REPORT_MS is written to OUT.jsonl as one line, with
when it began (time.monotonic(), the clock every process of the benchmark shares), how
long it took, the main thread's CPU time in it (much less than the wall time: the loop
was blocked in a system call, or the process waited for a CPU), and the stacks a thread
saw in it every SAMPLE_S, most frequent first (mypyc-compiled functions are not frames:
their Python callers show). A moment when the sampling thread itself did not run for
GAP_MS is written as `"gap": true`: the process got no CPU, or C code held the GIL.
The sampler takes the GIL every SAMPLE_S during a long pass: it finds stalls, it does not
time a run. `broker` is imported as `broker run` imports it (the venv's install, or the
checkout PYTHONPATH names).
"""

import json
import selectors
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

SAMPLE_S = 0.002
REPORT_MS = 20.0
GAP_MS = 30.0
DEPTH = 14  # frames kept of each stack, innermost first
STACKS = 3  # stacks kept per pass


def _where(filename: str) -> str:
    """A source file as `broker/...`, `<distribution>/...` or the standard library's
    `<module>.py`: enough to tell the broker's own frames from the rest."""
    for marker in ("/broker/", "/site-packages/"):
        if marker in filename:
            tail = filename.rsplit(marker, 1)[1]
            return f"broker/{tail}" if marker == "/broker/" else tail
    return Path(filename).name


def _stack(frame: FrameType | None) -> tuple[str, ...]:
    out: list[str] = []
    while frame is not None and len(out) < DEPTH:
        code = frame.f_code
        out.append(f"{_where(code.co_filename)}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return tuple(out)


def site(entry: dict[str, Any]) -> str:
    """Where a long pass was spent: the innermost frame of the broker's own code in its
    most frequent stack."""
    if not entry.get("stacks"):
        return "(not sampled)"
    frames = entry["stacks"][0][1]
    return next((f for f in frames if f.startswith("broker/")), "(no frame of broker/)")


class Watch:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.main = threading.get_ident()
        self.left = time.monotonic()  # when the main thread last left the selector
        self.cpu_left = time.thread_time()
        self.waiting = False
        self.long: list[tuple[float, float, float]] = []  # passes: began, seconds, CPU
        self.stacks: dict[float, Counter[tuple[str, ...]]] = {}

    def wrap(self, select: Callable[..., Any]) -> Callable[..., Any]:
        def watched(selector: selectors.BaseSelector, timeout: float | None = None) -> Any:
            if threading.get_ident() != self.main:
                return select(selector, timeout)
            if (busy := time.monotonic() - self.left) * 1000 >= REPORT_MS:
                self.long.append((self.left, busy, time.thread_time() - self.cpu_left))
            self.waiting = True
            try:
                return select(selector, timeout)
            finally:
                self.waiting = False
                self.left, self.cpu_left = time.monotonic(), time.thread_time()

        return watched

    def run(self) -> None:
        with self.out.open("a", buffering=1) as log:
            last = time.monotonic()
            while True:
                time.sleep(SAMPLE_S)
                now = time.monotonic()
                if (now - last) * 1000 >= GAP_MS:
                    log.write(json.dumps({"gap": True, "at": last,
                                          "ms": round((now - last) * 1000, 1)}) + "\n")
                last = now
                began = self.left
                if not self.waiting and (now - began) * 1000 >= REPORT_MS / 2:
                    frame = sys._current_frames().get(self.main)
                    if not self.waiting and self.left == began:
                        self.stacks.setdefault(began, Counter())[_stack(frame)] += 1
                    del frame
                while self.long:
                    began, busy, cpu = self.long.pop(0)
                    seen = self.stacks.pop(began, Counter())
                    log.write(json.dumps({
                        "gap": False, "at": began, "ms": round(busy * 1000, 1),
                        "cpu_ms": round(cpu * 1000, 1),
                        "stacks": [[n, list(s)] for s, n in seen.most_common(STACKS)]}) + "\n")
                for stale in [b for b in self.stacks if b != self.left]:
                    del self.stacks[stale]


def read(path: Path, began: float, ended: float) -> list[dict[str, Any]]:
    """The entries written to `path` that began between `began` and `ended`, longest
    first."""
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines() if line]
    return sorted((e for e in entries if began <= e["at"] <= ended), key=lambda e: -e["ms"])


def main() -> int:
    watch = Watch(Path(sys.argv[1]))
    watched = watch.wrap(selectors.EpollSelector.select)
    selectors.EpollSelector.select = watched  # type: ignore[method-assign]
    threading.Thread(target=watch.run, name="loopwatch", daemon=True).start()
    from broker.cli import main as broker_main

    return broker_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
