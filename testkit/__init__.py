"""The test kit: what the tests (tests/) and the benches (bench/) both need to run Sluice for real, so that
neither imports the other (an import-linter contract in pyproject.toml keeps it so).

- protocol_worker: the one worker that plays the gateway-worker protocol without a model, scripted or counted;
- sluice: `sluice serve` and real `python -m worker` processes on free ports;
- servers, databases: PostgreSQL and Redis started from the machine's binaries, fresh databases on them;
- admin: the admin API of a running server (`admin()`), the ledger's records;
- stub_gateway: `sluice serve` in front of a protocol worker process, set up for load;
- tiny_model, lora_adapters: tiny random Llamas and PEFT adapters;
- corpora: the grammar and tool-calling corpora;
- local_aws, played_ecs, fuzzing: moto's AWS, a played ECS service, fuzzing examples.

It is not shipped (pyproject's package list leaves it out). It is importable from the repository root: pytest
puts the root on sys.path (`pythonpath = ["."]`), each bench script puts it there itself, and the processes the
kit starts run with the root as their working directory.
"""
