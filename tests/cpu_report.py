"""CPU seconds per test file, for cutting the suite's time where the work is (not where the waiting is).

With SLUICE_TEST_CPU_REPORT=PATH each test process appends `seconds path` lines to PATH.<process> at its end:
the CPU time (user + system) of the test process and of the child processes it reaped (the servers and workers a
file started and stopped) while that file's tests ran. A session fixture's teardown (a session-wide server, reaped
then with all the CPU it spent for every file that used it) is reported apart, as `(session fixture NAME)`: on the
last file of each process it read as minutes of work that file never did. Sum the files with
`python -m tests.cpu_report PATH.*`.
"""

from __future__ import annotations

import os
import resource
import sys
from collections import Counter
from pathlib import Path

import pytest

VARIABLE = "SLUICE_TEST_CPU_REPORT"


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class CpuReport:
    def __init__(self, path: str):
        self.path = Path(f"{path}.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}")
        self.per_file: Counter[str] = Counter()
        self.moved = 0.0  # this test's CPU reported under a session fixture instead of its file
        self.mark: float | None = None  # during a teardown: when the last fixture finished tearing down

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item):
        began, self.moved = cpu_seconds(), 0.0
        yield
        self.per_file[item.nodeid.split("::", 1)[0]] += cpu_seconds() - began - self.moved

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item):
        self.mark = cpu_seconds()
        yield
        self.mark = None

    def pytest_fixture_post_finalizer(self, fixturedef: pytest.FixtureDef) -> None:
        """Called as each fixture's teardown ends: the CPU since the previous one ended is this one's."""
        if self.mark is None:  # not a teardown (a parametrized fixture set up again): stays on the file
            return
        now = cpu_seconds()
        if fixturedef.scope == "session":
            self.per_file[f"(session fixture {fixturedef.argname})"] += now - self.mark
            self.moved += now - self.mark
        self.mark = now

    def pytest_sessionfinish(self) -> None:
        with self.path.open("a") as report:
            report.writelines(f"{seconds:8.1f} {name}\n" for name, seconds in self.per_file.most_common())


def register(config: pytest.Config) -> None:
    path = os.environ.get(VARIABLE)
    if path:
        config.pluginmanager.register(CpuReport(path), "sluice-cpu-report")


def main(paths: list[str]) -> None:
    total: Counter[str] = Counter()
    for path in paths:
        for line in Path(path).read_text().splitlines():
            seconds, name = line.split(maxsplit=1)
            total[name] += float(seconds)
    print(f"# CPU seconds per test file, {sum(total.values()):.0f} in all")
    for name, seconds in total.most_common():
        print(f"{seconds:8.1f} {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
