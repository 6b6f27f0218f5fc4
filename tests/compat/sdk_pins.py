"""Exact SDK pins of the compatibility suites (from shared/api/sdk_clients.md), one virtualenv each."""

FRIENDLI_CLIENT = ["friendli-client==1.5.8", "grpcio<1.72", "grpcio-tools<1.72", "protobuf>=5.26.1,<6"]
FRIENDLI = ["friendli==0.16.3"]
MONSTERAPI = ["monsterapi==1.0.9.3"]

ALL = {"friendli-client": FRIENDLI_CLIENT, "friendli": FRIENDLI, "monsterapi": MONSTERAPI}
