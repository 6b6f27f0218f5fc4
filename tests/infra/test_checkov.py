"""checkov over infra/ (Terraform and Dockerfiles): no failed check, and every skip carries its
reason inline (`#checkov:skip=CKV_...:why`). checkov lives in its own venv, `.venv-checkov`, which
`make checkov` creates (`make test` depends on it): its pins clash with the project's."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def checkov_binary() -> Path:
    """The Makefile's checkov; `make checkov` is a no-op once it is installed."""
    done = subprocess.run(["make", "-s", "checkov"], cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"make checkov failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return REPO / ".venv-checkov" / "bin" / "checkov"


@pytest.mark.slow
def test_checkov_finds_nothing_and_every_skip_says_why(tmp_path):
    report = tmp_path / "checkov"
    done = subprocess.run([str(checkov_binary()), "--directory", str(REPO / "infra"), "--framework", "terraform",
                           "dockerfile", "--output", "json", "--output-file-path", str(report),
                           "--skip-download"], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    path = report / "results_json.json"
    assert path.exists(), (f"checkov wrote no report (exit {done.returncode}):\n"
                           f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    results = json.loads(path.read_text())
    results = results if isinstance(results, list) else [results]
    assert {r["check_type"] for r in results} == {"terraform", "dockerfile"}
    failed, unexplained = [], []
    for result in results:
        summary = result["summary"]
        assert summary["parsing_errors"] == 0, result["check_type"]
        assert summary["passed"] > 100 or result["check_type"] == "dockerfile", summary
        for check in result["results"]["failed_checks"]:
            failed.append(f"{check['check_id']} {check['resource']} ({check['file_path']}:{check['file_line_range']})")
        for check in result["results"]["skipped_checks"]:
            reason = (check["check_result"].get("suppress_comment") or "").strip()
            if len(reason) < 20:
                unexplained.append(f"{check['check_id']} {check['resource']}: {reason!r}")
    assert failed == [], "\n".join(failed)
    assert unexplained == [], "\n".join(unexplained)
