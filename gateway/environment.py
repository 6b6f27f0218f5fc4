"""SLUICE_* environment variables: one per setting, derived from the settings structure (the rule is
common/settings_env.py, which names the worker's settings the same way: common/worker_settings.py), and the few
that are not settings, listed here.

Every field of the settings struct has a variable: SLUICE_ and its name in capitals (`request_timeout_s` is
SLUICE_REQUEST_TIMEOUT_S); the fields of a table join its name with a double underscore (`[http]
keep_alive_timeout_s` is SLUICE_HTTP__KEEP_ALIVE_TIMEOUT_S, `[default_team_limits] rpm` is
SLUICE_DEFAULT_TEAM_LIMITS__RPM). A value is converted to the field's type and checked against its bounds:
numbers, booleans (true, false, 1, 0), strings as given, a list of strings separated by commas
(SLUICE_TRUSTED_PROXIES=10.0.0.0/8,192.168.0.0/16), anything else as JSON (SLUICE_MODELS='[{"name": "m"}]'). An
empty value counts as unset. A field added to the settings has its variable at once: nothing here lists them.

A SLUICE_ variable that is neither a setting (the gateway's or a worker's) nor in NOT_SETTINGS is named in a
warning with the nearest setting, since a misspelt name is otherwise silently ignored.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

import msgspec

from common.settings_env import PREFIX, settings_variables
from common.worker_launch import PARENT_PID_ENV
from common.worker_settings import worker_variables

# SLUICE_ variables that are not settings of the gateway: what reads each one. Tests and benchmarks only read
# theirs; `sluice serve` ignores every one of them without a warning.
NOT_SETTINGS = {
    "SLUICE_CONFIG_TOML": "the whole config file in one variable (ECS task definitions): gateway/config.py",
    "SLUICE_CONFIG_S3": "the config file as an S3 object, s3://bucket/key[?versionId=v]: gateway/config_object.py",
    "SLUICE_LISTEN_FD": "internal: the socket a gateway process inherits from the first: gateway/cli/processes.py",
    "SLUICE_FIRST_GATEWAY_PID": "internal: the first gateway process, to its siblings: gateway/cli/processes.py",
    PARENT_PID_ENV: "internal: the gateway that started a worker process, which it dies with: common/worker_launch.py",
    "SLUICE_API_KEY": "docs: the key the README's client examples send (a client's, never read by sluice)",
    "SLUICE_ARTIFACTS": "test-only: where the dashboard tests write screenshots",
    "SLUICE_DISCONNECT_REQUESTS": "test-only: requests of tests/faults/test_disconnects.py",
    "SLUICE_BATCH_CRASH_LINES": "test-only: lines of tests/faults/test_batch_crash.py's batch (the issue's 2,000)",
    "SLUICE_SOAK_CLIENTS": "test-only: clients of tests/faults/test_soak.py",
    "SLUICE_SOAK_SECONDS": "test-only: length of tests/faults/test_soak.py",
    "SLUICE_FUZZ_SCALE": "test-only: examples per property test, times this (`make fuzz`)",
    "SLUICE_HYPOTHESIS_PROFILE": "test-only: the Hypothesis profile (tests/conftest.py)",
    "SLUICE_TEST_CPU_REPORT": "test-only: where each test process writes CPU seconds per file (tests/cpu_report.py)",
    "SLUICE_TOOL_PROOF_PROMPTS": "test-only: prompts of tests/compat/test_openai_tools.py and "
                                 "tests/worker/tools/test_proof.py (20: the whole corpus)",
    "SLUICE_TF_PLUGINS": "test-only: the Terraform provider mirror of tests/infra",
    "SLUICE_BENCH_QUICK": "bench-only: the small version of each benchmark (`make bench`)",
    "SLUICE_BENCH_NO_LEDGER": "bench-only: bench/ledger_gateway.py's baseline without a usage ledger: "
                              "gateway/cli/main.py",
}


def unknown(struct: type[msgspec.Struct], environ: Mapping[str, str]) -> list[str]:
    """One warning per SLUICE_ variable that is neither a setting nor in NOT_SETTINGS, naming the nearest setting."""
    known = settings_variables(struct)
    workers = worker_variables()  # a worker's own settings (common/worker_settings.py), set beside the gateway's
    lines = []
    for variable in sorted(name for name in environ if name.startswith(PREFIX)):
        if variable in known or variable in workers or variable in NOT_SETTINGS:
            continue
        nearest = difflib.get_close_matches(variable, known, n=1, cutoff=0.6)
        hint = f"did you mean {nearest[0]}?" if nearest else "the settings are listed under Configuration in README.md"
        lines.append(f"sluice: warning: {variable} is not a setting and is ignored ({hint})")
    return lines
