"""The test files' schedule: longest first, as tests/file_order.py promises and the Makefile keeps."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.file_order import REPO, longest_first, read_weights, weights_from_junit


@dataclass
class Item:
    nodeid: str


def test_files_come_longest_first_unknown_ones_before_all_and_each_keeps_its_own_order():
    items = [Item(n) for n in ("a.py::one", "b.py::one", "a.py::two", "c.py::one", "new.py::one", "b.py::two")]
    ordered = [i.nodeid for i in longest_first(items, {"a.py": 5.0, "b.py": 50.0, "c.py": 5.0})]
    assert ordered == ["new.py::one", "b.py::one", "b.py::two", "a.py::one", "a.py::two", "c.py::one"]


def test_weights_are_summed_per_file_from_a_junit_report(tmp_path: Path):
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.infra.test_file_order" name="a" time="1.5"/>'
        '<testcase classname="tests.infra.test_file_order" name="b" time="2.0"/>'
        '<testcase classname="tests.infra.test_lock.TestSomething" name="c" time="4.0"/>'
        '<testcase classname="tests.gone.test_removed" name="d" time="9.0"/>'
        '</testsuite></testsuites>')
    assert weights_from_junit(report) == {"tests/infra/test_file_order.py": 3.5, "tests/infra/test_lock.py": 4.0}


def test_the_weights_file_reads_and_the_makefile_keeps_the_order():
    assert read_weights(), "tests/file_weights.txt is empty"
    assert "--no-loadscope-reorder" in (REPO / "Makefile").read_text(), "xdist would reorder files by test count"
