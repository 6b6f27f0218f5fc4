"""Exact SDK pins of the compatibility suites (from shared/api/sdk_clients.md), one virtualenv each."""

FRIENDLI_CLIENT = ["friendli-client==1.5.8", "grpcio<1.72", "grpcio-tools<1.72", "protobuf>=5.26.1,<6"]
FRIENDLI = ["friendli==0.16.3"]
MONSTERAPI = ["monsterapi==1.0.9.3"]
# agent frameworks (tests/compat/test_agent_frameworks.py): each pins its own openai release (instructor an older one)
OPENAI_AGENTS = ["openai-agents==0.24.0"]
INSTRUCTOR = ["instructor==1.17.0"]

ALL = {"friendli-client": FRIENDLI_CLIENT, "friendli": FRIENDLI, "monsterapi": MONSTERAPI,
       "openai-agents": OPENAI_AGENTS, "instructor": INSTRUCTOR}
