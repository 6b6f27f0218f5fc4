"""The adapter fields of the contract: an endpoint's `adapters = { name = "source" }`, the LRU size and
rank limit, and `GenerateRequest.adapter`; every rule refuses bad values with a message."""

from __future__ import annotations

import msgspec
import pytest

from common.protocol import AdapterRef, GenerateRequest, ModelConfig
from gateway.config import load_settings


def test_defaults_and_a_valid_table():
    assert (ModelConfig().adapters, ModelConfig().max_loaded_adapters, ModelConfig().max_adapter_rank) == ({}, 8, 256)
    config = msgspec.convert({"adapters": {"support": "/srv/lora/support", "acme.sql-v2": "s3://lora/sql/v2"},
                              "max_loaded_adapters": 2, "max_adapter_rank": 64}, ModelConfig)
    assert config.adapters["acme.sql-v2"] == "s3://lora/sql/v2" and config.max_loaded_adapters == 2


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("adapters", {"a:b": "/x"}, "adapters"),  # ':' separates endpoint and adapter in OpenAI's model field
    ("adapters", {"../up": "/x"}, "adapters"),
    ("adapters", {"acme/sql": "/x"}, "adapters"),  # a URL path segment of the admin API
    ("adapters", {"": "/x"}, "adapters"),
    ("adapters", {"x" * 65: "/x"}, "adapters"),
    ("adapters", {"fine": ""}, "adapters"),
    ("adapters", ["not", "a", "table"], "adapters"),
    ("max_loaded_adapters", 0, "max_loaded_adapters"),
    ("max_loaded_adapters", 5000, "max_loaded_adapters"),
    ("max_loaded_adapters", "8", "max_loaded_adapters"),
    ("max_adapter_rank", 0, "max_adapter_rank"),
])
def test_bad_values_are_refused_naming_the_field(field, value, needle):
    with pytest.raises(msgspec.ValidationError, match=needle):
        msgspec.convert({field: value}, ModelConfig)


def test_the_config_file_takes_adapters_per_endpoint(tmp_path):
    support = tmp_path / "support"
    support.mkdir()
    (support / "adapter_config.json").write_text("{}")
    good = tmp_path / "good.toml"
    good.write_text('[[models]]\nname = "smol"\nmax_loaded_adapters = 4\n'
                    f'adapters = {{ support = "{support}", sql = "s3://lora/sql" }}\n'
                    # remote workers read their own disks: only the path's shape is checked here
                    '[[models]]\nname = "remote"\nadapters = { support = "/srv/lora/support" }\n'
                    '[models.provisioner]\nkind = "static"\nurls = ["http://10.0.0.7:8001"]\n')
    local, remote = load_settings(str(good)).models
    assert local.adapters == {"support": str(support), "sql": "s3://lora/sql"}
    assert remote.adapters == {"support": "/srv/lora/support"}
    missing = tmp_path / "missing.toml"
    missing.write_text('[[models]]\nname = "smol"\nadapters = { support = "/srv/lora/support" }\n')
    with pytest.raises(SystemExit, match="invalid configuration.*adapters.support.*adapter_config.json"):
        load_settings(str(missing))
    bad = tmp_path / "bad.toml"
    bad.write_text('[[models]]\nname = "smol"\nmax_loaded_adapters = 0\n')
    with pytest.raises(SystemExit, match="invalid configuration.*max_loaded_adapters"):
        load_settings(str(bad))


def test_a_request_carries_a_registered_adapter_by_name_and_source():
    decoded = msgspec.json.decode(b'{"request_id": "r", "model": "m", "adapter": {"name": "support", '
                                  b'"source": "/srv/lora/support"}}', type=GenerateRequest)
    assert decoded.adapter == AdapterRef(name="support", source="/srv/lora/support")
    assert msgspec.json.decode(b'{"request_id": "r", "model": "m"}', type=GenerateRequest).adapter is None
    with pytest.raises(msgspec.ValidationError, match="adapter.name"):
        msgspec.json.decode(b'{"request_id": "r", "model": "m", "adapter": {"name": "a b", "source": "/x"}}',
                            type=GenerateRequest)
