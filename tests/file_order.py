"""The order in which test files are handed to the test processes: longest first.

`make test` runs files whole on two processes (`--dist loadfile`): each takes the next file of the queue when it
is nearly done with its own. xdist's own order puts files with many tests first, so the few-test files that start
a real gateway and worker (minutes each) came last, and one process ran the last of them alone while the other
had nothing left: minutes of one idle core. Longest first (the classic answer to this scheduling problem) leaves
only short files for the end. The Makefile turns xdist's reordering off (`--no-loadscope-reorder`) so this order
holds.

The weights are seconds per file from a junit report of a whole run (`file_weights.txt`, regenerated with
`python -m tests.file_order JUNIT.xml > tests/file_weights.txt`). A file the list does not know goes first: a new
file may be long, and a short one costs nothing at the front.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

import pytest

WEIGHTS = Path(__file__).with_name("file_weights.txt")
REPO = Path(__file__).resolve().parents[1]


def read_weights(path: Path = WEIGHTS) -> dict[str, float]:
    """{path relative to the repository: seconds} from lines `seconds path`; '#' starts a comment."""
    weights: dict[str, float] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            seconds, name = line.split(maxsplit=1)
            weights[name] = float(seconds)
    return weights


def longest_first(items: list[pytest.Item], weights: dict[str, float]) -> list[pytest.Item]:
    """The items regrouped by file, files in descending weight (unknown files first), each file's own order kept;
    ties broken by path so every test process computes the same order (xdist checks they agree)."""
    def weight(item: pytest.Item) -> tuple[float, str]:
        name = item.nodeid.split("::", 1)[0]
        return (-weights.get(name, float("inf")), name)

    return sorted(items, key=weight)  # sorted() is stable: a file's tests keep their order


def weights_from_junit(report: Path) -> Counter[str]:
    """Seconds per test file in a junit report (each test case's time includes its fixtures' setup and teardown,
    so a module's server is counted in its file)."""
    per_file: Counter[str] = Counter()
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        parts = case.attrib["classname"].split(".")
        last = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
        name = "/".join(parts[:last + 1]) + ".py"
        if (REPO / name).is_file():
            per_file[name] += float(case.attrib.get("time", 0))
    return per_file


def main(report: str) -> None:
    per_file = weights_from_junit(Path(report))
    print(f"# seconds per test file of a whole run: python -m tests.file_order {Path(report).name}")
    for name, seconds in sorted(per_file.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"{seconds:8.1f} {name}")


if __name__ == "__main__":
    main(sys.argv[1])
