"""The memory a server costs: its process and every process under it (a worker's grammar compile server, its
compile processes, multiprocessing's resource tracker), sampled while a bench runs.

Two figures, since a sum of RSS counts a page once per process that maps it (the compile processes fork from one
server and share its pages; every Python process maps the same libraries):
- peak RSS: each process's own peak (VmHWM, kept for a process that has exited since), summed. An upper bound.
- peak PSS: the most that the summed PSS (each shared page split among the processes that map it) reached at a
  sample. What the processes hold between them; a spike shorter than the sampling interval can escape it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path


def process_tree(pid: int) -> list[tuple[int, int]]:
    """(pid, its parent's pid) for `pid` (parent 0) and its descendants that are alive now."""
    tree, index = [(pid, 0)], 0
    while index < len(tree):
        parent = tree[index][0]
        try:
            for task in Path(f"/proc/{parent}/task").iterdir():
                tree.extend((int(child), parent) for child in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            pass
        index += 1
    return tree


def _status_kb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith(key + ":"))


def _pss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("Pss:"))


def _name(pid: int, parent: str) -> str:
    """What a process is, from its command line (a compile process is a fork of the compile server: by its parent)."""
    words = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    text = " ".join(words)
    for marker, name in (("forkserver", "grammar compile server"), ("resource_tracker", "resource tracker"),
                         ("-m worker", "worker"), ("llama-server", "llama-server")):
        if marker in text:
            return "grammar compile process" if parent == "grammar compile server" else name
    return Path(words[0]).name


@dataclass
class TreeMemory:
    """Samples `pid`'s process tree every `interval_s` from `start()` to `stop()`."""

    pid: int
    interval_s: float = 0.5
    peaks_kb: dict[int, tuple[str, int]] = field(default_factory=dict)  # pid -> (name, VmHWM)
    pss_kb: dict[int, int] = field(default_factory=dict)  # pid -> its PSS at the sample of the highest sum
    peak_pss_kb: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        total, pss = 0, {}
        for pid, parent in process_tree(self.pid):
            try:
                known = self.peaks_kb.get(pid) or (_name(pid, self.peaks_kb.get(parent, ("",))[0]), 0)
                self.peaks_kb[pid] = (known[0], max(known[1], _status_kb(pid, "VmHWM")))
                pss[pid] = _pss_kb(pid)
                total += pss[pid]
            except (FileNotFoundError, ProcessLookupError, StopIteration):  # it exited meanwhile
                continue
        if total >= self.peak_pss_kb:
            self.peak_pss_kb, self.pss_kb = total, pss

    def start(self) -> TreeMemory:
        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                self.sample()

        self.sample()
        self._thread = threading.Thread(target=loop, name="bench-memory", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    @property
    def peak_rss_mb(self) -> float:
        return sum(kb for _, kb in self.peaks_kb.values()) / 1024

    @property
    def peak_pss_mb(self) -> float:
        return self.peak_pss_kb / 1024

    def breakdown(self) -> str:
        """Each process's peak RSS / its PSS at the peak sample, largest first: "worker 1,004 / 950 + ..."."""
        rows = sorted(self.peaks_kb.items(), key=lambda row: -row[1][1])
        return " + ".join(f"{name} {kb / 1024:,.0f} / {self.pss_kb.get(pid, 0) / 1024:,.0f}"
                          for pid, (name, kb) in rows)
