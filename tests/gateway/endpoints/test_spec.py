"""Endpoint specs: every validation rule names its field, each setting has one spelling (an earlier one is refused
naming it), the worker is sent only what it reads, and a PATCH changes only what may change on a running
endpoint."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import msgspec
import pytest

from common.protocol import ModelConfig
from gateway.endpoints.spec import (
    PATCHABLE,
    RETIRED,
    EcsProvisioning,
    EndpointSpec,
    LocalProvisioning,
    StaticProvisioning,
    parse_endpoint,
)

NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"


def refused(raw: dict) -> str:
    with pytest.raises(msgspec.ValidationError) as caught:
        parse_endpoint({"name": NAME, **raw})
    return str(caught.value)


@pytest.mark.parametrize(("raw", "field"), [
    ({"name": ""}, "`name`"),
    ({"name": "x" * 257}, "`name`"),
    ({"name": "org/ model"}, "`name`"),
    ({"name": "org/\x07model"}, "`name`"),
    ({"name": "/model"}, "`name`"),
    ({"name": "org/"}, "`name`"),
    ({"name": "org//model"}, "`name`"),
    ({"min_replicas": -1}, "`min_replicas`"),
    ({"max_replicas": 0}, "`max_replicas`"),
    ({"min_replicas": 3, "max_replicas": 2}, "`min_replicas` (3) must not exceed `max_replicas` (2)"),
    ({"target_concurrency": 0}, "`target_concurrency`"),
    ({"target_concurrency": -2.5}, "`target_concurrency`"),
    ({"idle_seconds": -1}, "$.idle_seconds"),
    ({"max_wait_seconds": 0}, "`max_wait_seconds`"),
    ({"max_wait_seconds": -3}, "$.max_wait_seconds"),
    ({"drain_seconds": -1}, "$.drain_seconds"),
    ({"max_queue": -1}, "`max_queue`"),
    ({"max_waiting": -1}, "`max_waiting`"),
    ({"max_waiting": "many"}, "$.max_waiting"),
    ({"max_batch_size": 0}, "`max_batch_size`"),
    ({"max_batched_tokens": 0}, "`max_batched_tokens`"),
    ({"threads": -1}, "`threads`"),
    ({"decode_threads": -1}, "$.decode_threads"),
    ({"max_context": 1}, "`max_context`"),
    ({"grammar_compile_timeout_s": 0}, "`grammar_compile_timeout_s`"),
    ({"ordinary_share_beside_beams": 1.0}, "$.ordinary_share_beside_beams"),
    ({"quantization": "int3"}, "$.quantization"),
    ({"quantization": "q5"}, "$.quantization"),
    ({"quantization": "Q4"}, "$.quantization"),
    ({"dtype": "float8"}, "$.dtype"),
    ({"team_id": "  "}, "`team_id`"),
    ({"provisioner": {"kind": "static", "urls": []}}, "`provisioner.urls`"),
    ({"provisioner": {"kind": "static", "urls": ["ftp://w"]}}, "`provisioner.urls`"),
    ({"provisioner": {"kind": "static", "urls": ["http://"]}}, "`provisioner.urls`"),
    ({"provisioner": {"kind": "static", "urls": ["http://w:port"]}}, "`provisioner.urls`"),
    ({"provisioner": {"kind": "static", "urls": ["http://w:1"]}, "max_replicas": 3}, "never scaled"),
    ({"provisioner": {"kind": "ecs", "service": "s"}}, "`cluster`"),
    ({"provisioner": {"kind": "ecs", "cluster": " ", "service": "s"}}, "`provisioner.cluster`"),
    ({"provisioner": {"kind": "ecs", "cluster": "c", "service": ""}}, "`provisioner.service`"),
    ({"provisioner": {"kind": "ecs", "cluster": "c", "service": "s", "region": ""}}, "`provisioner.region`"),
    ({"provisioner": {"kind": "ecs", "cluster": "c", "service": "s", "port": 0}}, "$.provisioner.port"),
    ({"provisioner": {"kind": "ecs", "cluster": "c", "service": "s", "port": 70000}}, "$.provisioner.port"),
    ({"provisioner": {"kind": "ecs", "cluster": "c", "service": "s", "endpoint_url": "moto"}},
     "`provisioner.endpoint_url`"),
    ({"provisioner": {"kind": "kubernetes"}}, "$.provisioner"),
    ({"provisioner": {"kind": "local", "urls": ["http://w:1"]}}, "$.provisioner"),
    ({"adapters": {"poet": "relative/poet"}}, "`adapters.poet` must be an absolute path"),
    ({"adapters": {"poet": "/nonexistent/poet"}}, "`adapters.poet` must be an absolute path"),
    ({"adapters": {"poet": "s3://"}}, "`adapters.poet` must be s3://<bucket>/<prefix>"),
    ({"adapters": {"poet": "s3:///prefix"}}, "`adapters.poet` must be s3://<bucket>/<prefix>"),
    ({"adapters": {"poet": ""}}, "$.adapters"),
    ({"adapters": {"a/b": "s3://b/p"}}, "$.adapters"),
    ({"min_replica": 0}, "min_replica"),
    ({"min_replicas": "zero"}, "$.min_replicas"),
])
def test_every_rule_names_its_field(raw, field):
    assert field in refused(raw)


def test_the_native_q4_mode_is_accepted():
    assert parse_endpoint({"name": NAME, "quantization": "q4"}).quantization == "q4"


def test_defaults_are_one_always_on_local_replica():
    spec = parse_endpoint({"name": NAME})
    assert (spec.min_replicas, spec.max_replicas) == (1, 1)
    assert isinstance(spec.provisioner, LocalProvisioning)
    assert spec.team_id is None and not spec.private and spec.scalable


def test_min_alone_sets_max_to_at_least_one_and_max_alone_keeps_min_one():
    assert (parse_endpoint({"name": NAME, "min_replicas": 0}).max_replicas) == 1
    assert (parse_endpoint({"name": NAME, "min_replicas": 3}).max_replicas) == 3
    spec = parse_endpoint({"name": NAME, "max_replicas": 4})
    assert (spec.min_replicas, spec.max_replicas) == (1, 4)


STATIC = {"kind": "static", "urls": ["http://w:1"]}


@pytest.mark.parametrize(("old", "new"), [
    ({"replicas": 2}, "`min_replicas` and `max_replicas`"),
    ({"urls": ["http://w:8100"]}, 'provisioner = {kind = "static", urls = [...]}'),
])
def test_an_earlier_spelling_is_refused_naming_the_one_to_use(old, new):
    with pytest.raises(ValueError, match=re.escape(new)) as caught:
        parse_endpoint({"name": NAME, **old})
    assert f"`{next(iter(old))}` is no longer a setting" in str(caught.value)
    assert set(RETIRED) == {"replicas", "urls"}


def test_a_config_file_in_the_one_spelling():
    config = tomllib.loads(f"""
        [[models]]
        name = "{NAME}"
        min_replicas = 2
        max_replicas = 2
        max_batch_size = 16

        [[models]]
        name = "remote/model"
        provisioner = {{ kind = "static", urls = ["http://10.0.0.5:8100", "http://10.0.0.6:8100"] }}
    """)
    local, remote = msgspec.convert(config["models"], list[EndpointSpec])
    assert (local.min_replicas, local.max_replicas, local.max_batch_size) == (2, 2, 16)
    assert isinstance(local.provisioner, LocalProvisioning)
    assert remote.provisioner == StaticProvisioning(urls=["http://10.0.0.5:8100", "http://10.0.0.6:8100"])
    assert (remote.min_replicas, remote.max_replicas) == (2, 2) and not remote.scalable


def test_an_endpoint_config_entry_with_every_new_field():
    config = tomllib.loads(f"""
        [[models]]
        name = "{NAME}"
        min_replicas = 0
        max_replicas = 3
        target_concurrency = 4
        idle_seconds = 30
        max_queue = 50
        max_wait_seconds = 20
        drain_seconds = 15
        team_id = "team-a"
        [models.provisioner]
        kind = "ecs"
        cluster = "sluice"
        service = "smollm2"
        region = "eu-west-1"
        port = 8100
    """)
    spec = msgspec.convert(config["models"][0], EndpointSpec)
    assert spec.provisioner == EcsProvisioning(cluster="sluice", service="smollm2", region="eu-west-1", port=8100)
    assert (spec.min_replicas, spec.max_replicas, spec.target_concurrency) == (0, 3, 4.0)
    assert (spec.idle_seconds, spec.max_queue, spec.max_wait_seconds, spec.drain_seconds) == (30, 50, 20, 15)
    assert spec.private


def test_the_worker_gets_its_model_config_and_nothing_of_scaling():
    spec = parse_endpoint({"name": NAME, "min_replicas": 0, "max_batch_size": 8, "source": "/models/x"})
    worker = spec.worker_config()
    assert type(worker) is ModelConfig
    assert (worker.name, worker.max_batch_size, worker.source) == (NAME, 8, "/models/x")
    decoded = msgspec.json.decode(msgspec.json.encode(worker), type=ModelConfig)  # the worker's own decoder
    assert decoded == worker
    assert not set(ModelConfig.__struct_fields__) & {"replicas", "urls", "min_replicas", "provisioner", "max_waiting"}


def test_the_worker_reads_every_field_it_is_sent():
    """The wire config carries only what the worker uses: each field is read somewhere under worker/."""
    source = "\n".join(path.read_text() for path in (Path(__file__).parents[3] / "worker").rglob("*.py"))
    unread = [field for field in ModelConfig.__struct_fields__ if not re.search(rf"\.{field}\b", source)]
    assert unread == []


def test_the_stored_form_round_trips_and_omits_defaults():
    spec = parse_endpoint({"name": NAME, "provisioner": STATIC, "team_id": "t"})
    stored = msgspec.to_builtins(spec)
    assert "max_batch_size" not in stored and stored["provisioner"] == STATIC
    assert msgspec.convert(stored, EndpointSpec) == spec


def test_a_patch_changes_bounds_and_checks_every_rule_again():
    spec = parse_endpoint({"name": NAME, "min_replicas": 0, "max_replicas": 2})
    patched = spec.patched({"max_replicas": 5, "idle_seconds": 10, "team_id": "t"})
    assert (patched.min_replicas, patched.max_replicas, patched.idle_seconds, patched.team_id) == (0, 5, 10, "t")
    with pytest.raises(msgspec.ValidationError, match="must not exceed"):
        spec.patched({"min_replicas": 4})
    with pytest.raises(ValueError, match="`source` cannot change on a running endpoint"):
        spec.patched({"source": "/elsewhere"})
    with pytest.raises(ValueError, match="`name` cannot change"):
        spec.patched({"name": "other"})
    assert set(PATCHABLE) <= set(EndpointSpec.__struct_fields__)


def test_the_gateways_queue_and_each_workers_queue_are_two_settings():
    old = parse_endpoint({"name": NAME, "max_queue": 7})  # each bound has its own default: no setting stands in
    assert (old.max_waiting, old.worker_config().max_queue) == (256, 7)
    split = parse_endpoint({"name": NAME, "max_queue": 7, "max_waiting": 0})  # refuse at once when no replica is free
    assert (split.max_waiting, split.worker_config().max_queue) == (0, 7)
    assert "max_waiting" not in msgspec.to_builtins(split.worker_config())  # the worker knows its own queue only
    patched = old.patched({"max_waiting": 50})  # the gateway's queue changes at run time; the workers' does not
    assert (patched.max_waiting, patched.worker_config().max_queue) == (50, 7)
    assert old.patched({"min_replicas": 0}).worker_config().max_queue == 7
    with pytest.raises(ValueError, match="`max_queue` cannot change on a running endpoint"):
        old.patched({"max_queue": 9})
    assert msgspec.convert(msgspec.to_builtins(split), EndpointSpec) == split


def test_a_static_endpoint_patches_everything_but_its_size():
    spec = parse_endpoint({"name": NAME, "provisioner": STATIC})
    assert spec.patched({"max_wait_seconds": 3}).max_wait_seconds == 3
    with pytest.raises(msgspec.ValidationError, match="never scaled"):
        spec.patched({"max_replicas": 2})


def test_declared_adapters_are_an_s3_prefix_or_a_peft_directory(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    spec = parse_endpoint({"name": NAME, "adapters": {"poet": str(tmp_path), "verse": "s3://bucket/verse"}})
    assert spec.adapters == {"poet": str(tmp_path), "verse": "s3://bucket/verse"}
    with pytest.raises(msgspec.ValidationError, match="adapters.poet"):  # a directory without adapter_config.json
        parse_endpoint({"name": NAME, "adapters": {"poet": str(tmp_path.parent)}})
    # workers elsewhere (static, ECS) read their own disks: only the path's shape is checked here
    remote = parse_endpoint({"name": NAME, "provisioner": STATIC, "adapters": {"poet": "/srv/lora/poet"}})
    assert remote.adapters == {"poet": "/srv/lora/poet"}
    with pytest.raises(msgspec.ValidationError, match="adapters.poet"):
        parse_endpoint({"name": NAME, "provisioner": STATIC, "adapters": {"poet": "lora/poet"}})


def test_an_ecs_endpoint_waits_for_a_gpu_cold_start_by_default():
    from gateway.endpoints.scaling import ScalingSettings
    ecs = {"kind": "ecs", "cluster": "c", "service": "s"}
    assert parse_endpoint({"name": NAME, "provisioner": ecs}).max_wait_seconds == 600
    assert parse_endpoint({"name": NAME}).max_wait_seconds == 120  # local and static keep theirs
    assert parse_endpoint({"name": NAME, "provisioner": ecs, "max_wait_seconds": 30}).max_wait_seconds == 30
    spec = parse_endpoint({"name": NAME, "provisioner": ecs})
    assert parse_endpoint(msgspec.to_builtins(spec)).max_wait_seconds == 600  # as stored and read back
    assert ScalingSettings().ecs_start_timeout_seconds == 1800 and ScalingSettings().start_timeout_seconds == 600
    assert msgspec.convert({"ecs_start_timeout_seconds": 2400}, ScalingSettings).ecs_start_timeout_seconds == 2400
    with pytest.raises(msgspec.ValidationError, match="ecs_start_timeout_seconds"):
        msgspec.convert({"ecs_start_timeout_seconds": 0}, ScalingSettings)
