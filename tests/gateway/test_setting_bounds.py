"""Every numeric setting's range is honoured or refused at start, in one line naming the field: each boundary
value loads, the value just past it stops the start (issue #49 item 6). That the worker honours the lowest
values of its own settings (max_queue 0, max_context 2, ...) is tested on a real `sluice serve` in
tests/e2e/test_lowest_worker_settings.py."""

from __future__ import annotations

import pytest

from gateway.config import load_settings

MODEL = '[[models]]\nname = "HuggingFaceTB/SmolLM2-135M-Instruct"\n'

# (TOML at the boundary: loads, TOML just past it: refused, the field the refusal names)
BOUNDARIES = [
    ("port = 1", "port = 0", "port"),
    ("port = 65535", "port = 65536", "port"),
    ("max_body_bytes = 1024", "max_body_bytes = 1023", "max_body_bytes"),
    ("max_body_bytes = 1073741824", "max_body_bytes = 1073741825", "max_body_bytes"),
    ("rejections_per_minute = 1", "rejections_per_minute = 0", "rejections_per_minute"),
    ("gateway_processes = 1", "gateway_processes = 0", "gateway_processes"),
    ("shutdown_grace_seconds = 0", "shutdown_grace_seconds = -0.1", "shutdown_grace_seconds"),
    ("shutdown_grace_seconds = 3600", "shutdown_grace_seconds = 3601", "shutdown_grace_seconds"),
    ("request_timeout_s = 86400", "request_timeout_s = 0", "request_timeout_s"),
    ("health_generate_interval_s = 3600", "health_generate_interval_s = inf", "health_generate_interval_s"),
    ("ledger_min_free_bytes = 0", "ledger_min_free_bytes = -1", "ledger_min_free_bytes"),
    ("[http]\nmax_header_bytes = 1024", "[http]\nmax_header_bytes = 1023", "max_header_bytes"),
    ("[http]\nkeep_alive_timeout_s = 4200", "[http]\nkeep_alive_timeout_s = 4201", "keep_alive_timeout_s"),
    ("[http]\nmax_connections_per_client = 0", "[http]\nmax_connections_per_client = -1",
     "max_connections_per_client"),
    ("[scaling]\ntick_seconds = 0.01", "[scaling]\ntick_seconds = 0", "tick_seconds"),
    ("[scaling]\nstart_timeout_seconds = 86400", "[scaling]\nstart_timeout_seconds = inf", "start_timeout_seconds"),
    ("[scaling]\nstart_failures = 1", "[scaling]\nstart_failures = 0", "start_failures"),
    ("[scaling]\nstart_failures = 1000", "[scaling]\nstart_failures = 1001", "start_failures"),
    ("[scaling]\npanic_threshold = 1", "[scaling]\npanic_threshold = 0.99", "panic_threshold"),
    ("[scaling]\nburst_factor = 1000", "[scaling]\nburst_factor = 1001", "burst_factor"),
    ("[budget_alerts]\nattempts = 5", "[budget_alerts]\nattempts = 6", "attempts"),
    ("[budget_alerts]\ntimeout_s = 60", "[budget_alerts]\ntimeout_s = 0", "timeout_s"),
    ("[budget_alerts]\nsmtp_port = 65535", "[budget_alerts]\nsmtp_port = 0", "smtp_port"),
    ("[http]\nheader_timeout_s = 3600", "[http]\nheader_timeout_s = 0", "header_timeout_s"),
    ("[http]\nbody_timeout_s = 3600", "[http]\nbody_timeout_s = 3601", "body_timeout_s"),
    ("stream_write_timeout_s = 3600", "stream_write_timeout_s = 0", "stream_write_timeout_s"),
    ("[cloudwatch]\ninterval_seconds = 3600", "[cloudwatch]\ninterval_seconds = 0", "interval_seconds"),
    ("[scaling]\nhealth_interval_seconds = 86400", "[scaling]\nhealth_interval_seconds = 86401",
     "health_interval_seconds"),
    ("[scaling]\necs_api_calls_per_second = 2", "[scaling]\necs_api_calls_per_second = 1.99",
     "ecs_api_calls_per_second"),
    ("[scaling]\nfleet_config_check_seconds = 0.05", "[scaling]\nfleet_config_check_seconds = 0.04",
     "fleet_config_check_seconds"),
    ("[scaling]\nfleet_config_check_seconds = 3600", "[scaling]\nfleet_config_check_seconds = 3601",
     "fleet_config_check_seconds"),
    ("[default_team_limits]\nrpm = 0", "[default_team_limits]\nrpm = -1", "rpm"),
    (MODEL + "max_queue = 0", MODEL + "max_queue = -1", "max_queue"),
    (MODEL + "max_queue = 1048576", MODEL + "max_queue = 1048577", "max_queue"),
    (MODEL + "max_batch_size = 1", MODEL + "max_batch_size = 0", "max_batch_size"),
    (MODEL + "max_batch_size = 4096", MODEL + "max_batch_size = 4097", "max_batch_size"),
    (MODEL + "max_batched_tokens = 1", MODEL + "max_batched_tokens = 0", "max_batched_tokens"),
    (MODEL + "max_context = 2", MODEL + "max_context = 1", "max_context"),
    (MODEL + "max_context = 4194304", MODEL + "max_context = 4194305", "max_context"),
    (MODEL + "threads = 0", MODEL + "threads = -1", "threads"),
    (MODEL + "threads = 1024", MODEL + "threads = 1025", "threads"),
    (MODEL + "decode_threads = 1024", MODEL + "decode_threads = 1025", "decode_threads"),
    (MODEL + "grammar_compile_timeout_s = 3600", MODEL + "grammar_compile_timeout_s = 0",
     "grammar_compile_timeout_s"),
    (MODEL + "grammar_cache_bytes = 0", MODEL + "grammar_cache_bytes = -1", "grammar_cache_bytes"),
    (MODEL + "prefix_cache_bytes = 0", MODEL + "prefix_cache_bytes = -1", "prefix_cache_bytes"),
    (MODEL + "ordinary_share_beside_beams = 0", MODEL + "ordinary_share_beside_beams = 1",
     "ordinary_share_beside_beams"),
    (MODEL + "max_loaded_adapters = 1", MODEL + "max_loaded_adapters = 0", "max_loaded_adapters"),
    (MODEL + "max_adapter_rank = 4096", MODEL + "max_adapter_rank = 4097", "max_adapter_rank"),
    (MODEL + "adapter_retry_s = 0", MODEL + "adapter_retry_s = -1", "adapter_retry_s"),
    (MODEL + "min_replicas = 0", MODEL + "min_replicas = -1", "min_replicas"),
    (MODEL + "max_replicas = 1", MODEL + "max_replicas = 0", "max_replicas"),
    (MODEL + "max_waiting = 0", MODEL + "max_waiting = -1", "max_waiting"),
    (MODEL + "idle_seconds = 0", MODEL + "idle_seconds = inf", "idle_seconds"),
    (MODEL + "drain_seconds = 604800", MODEL + "drain_seconds = 604801", "drain_seconds"),
    (MODEL + "max_wait_seconds = 604800", MODEL + "max_wait_seconds = 0", "max_wait_seconds"),
    (MODEL + "target_concurrency = 0.5", MODEL + "target_concurrency = 0", "target_concurrency"),
    ("limiter_outage_gateways = 1", "limiter_outage_gateways = 0", "limiter_outage_gateways"),
    ("limiter_outage_gateways = 10000", "limiter_outage_gateways = 10001", "limiter_outage_gateways"),
    ("max_keys_per_team = 1", "max_keys_per_team = 0", "max_keys_per_team"),
    ("max_keys_per_team = 1000000", "max_keys_per_team = 1000001", "max_keys_per_team"),
    ("max_key_records_per_team = 0", "max_key_records_per_team = -1", "max_key_records_per_team"),
    ("max_key_records_per_team = 100000000", "max_key_records_per_team = 100000001", "max_key_records_per_team"),
    ("key_retention_s = 0", "key_retention_s = -1", "key_retention_s"),
    ("key_retention_s = 316224000", "key_retention_s = 316224001", "key_retention_s"),
    ("audit_retention_s = 86400", "audit_retention_s = 86399", "audit_retention_s"),
    ("audit_retention_s = 316224000", "audit_retention_s = inf", "audit_retention_s"),
    ("team_audit_entries_per_day = 1", "team_audit_entries_per_day = 0", "team_audit_entries_per_day"),
    ("team_audit_entries_per_day = 1000000", "team_audit_entries_per_day = 1000001", "team_audit_entries_per_day"),
    ("[http]\nmax_buffered_body_bytes = 65536", "[http]\nmax_buffered_body_bytes = 65535", "max_buffered_body_bytes"),
    ("[http]\nmax_buffered_body_bytes_per_client = 65536", "[http]\nmax_buffered_body_bytes_per_client = 65535",
     "max_buffered_body_bytes_per_client"),
    ("[responses]\nretention_s = 31622400", "[responses]\nretention_s = 31622401", "retention_s"),
    ("[responses]\nretention_s = 0.001", "[responses]\nretention_s = 0", "retention_s"),
    ("[responses]\nmax_response_bytes = 1024", "[responses]\nmax_response_bytes = 1023", "max_response_bytes"),
    ("[responses]\nmax_response_bytes = 67108864", "[responses]\nmax_response_bytes = 67108865",
     "max_response_bytes"),
    ("[responses]\nteam_max_bytes = 0", "[responses]\nteam_max_bytes = -1", "team_max_bytes"),
    ("[responses]\nmax_total_bytes = 0", "[responses]\nmax_total_bytes = -1", "max_total_bytes"),
    ("[responses]\nteam_max_responses = 0", "[responses]\nteam_max_responses = -1", "team_max_responses"),
    ("[responses]\nsweep_interval_s = 0.1", "[responses]\nsweep_interval_s = 0.05", "sweep_interval_s"),
    ("[responses]\nsweep_interval_s = 86400", "[responses]\nsweep_interval_s = inf", "sweep_interval_s"),
    ("[batches]\nmax_file_bytes = 1024", "[batches]\nmax_file_bytes = 1023", "max_file_bytes"),
    ("[batches]\nmax_file_lines = 1000000", "[batches]\nmax_file_lines = 1000001", "max_file_lines"),
    ("[batches]\nmax_file_lines = 1", "[batches]\nmax_file_lines = 0", "max_file_lines"),
    ("[batches]\nteam_max_file_bytes = 0", "[batches]\nteam_max_file_bytes = -1", "team_max_file_bytes"),
    ("[batches]\nteam_max_enqueued_tokens = 0", "[batches]\nteam_max_enqueued_tokens = -1",
     "team_max_enqueued_tokens"),
    ("[batches]\nin_flight_per_endpoint = 4096", "[batches]\nin_flight_per_endpoint = 4097",
     "in_flight_per_endpoint"),
    ("[batches]\nlease_s = 1", "[batches]\nlease_s = 0.5", "lease_s"),
    ("[batches]\npoll_interval_s = 60", "[batches]\npoll_interval_s = 61", "poll_interval_s"),
    ("[batches]\nfile_retention_s = 31622400", "[batches]\nfile_retention_s = 0", "file_retention_s"),
    ("[batches]\nmax_line_bytes = 1024", "[batches]\nmax_line_bytes = 1023", "max_line_bytes"),
    ("[batches]\nmax_line_bytes = 1073741824", "[batches]\nmax_line_bytes = 1073741825", "max_line_bytes"),
    ("[batches]\nteam_max_concurrent_uploads = 1", "[batches]\nteam_max_concurrent_uploads = 0",
     "team_max_concurrent_uploads"),
    ("[batches]\nteam_max_concurrent_uploads = 1000", "[batches]\nteam_max_concurrent_uploads = 1001",
     "team_max_concurrent_uploads"),
    ("[batches]\nmax_concurrent_uploads = 1", "[batches]\nmax_concurrent_uploads = 0", "max_concurrent_uploads"),
    ("[batches]\nmax_concurrent_uploads = 10000", "[batches]\nmax_concurrent_uploads = 10001",
     "max_concurrent_uploads"),
    ("[batches]\nupload_timeout_s = 1", "[batches]\nupload_timeout_s = 0.5", "upload_timeout_s"),
    ("[batches]\nupload_timeout_s = 86400", "[batches]\nupload_timeout_s = 86401", "upload_timeout_s"),
    ('[batches]\nfile_bucket = "my.bucket-1"', '[batches]\nfile_bucket = "Not_A_Bucket"', "file_bucket"),
]


@pytest.mark.parametrize(("good", "bad", "field"), BOUNDARIES, ids=[b[1].split("\n")[-1] for b in BOUNDARIES])
def test_the_boundary_loads_and_the_value_past_it_stops_the_start(tmp_path, good, bad, field):
    config = tmp_path / "sluice.toml"
    config.write_text(good + "\n")
    load_settings(str(config))
    config.write_text(bad + "\n")
    with pytest.raises(SystemExit) as stopped:
        load_settings(str(config))
    message = str(stopped.value)
    assert field in message and "\n" not in message, message


def test_the_key_records_cap_defaults_to_four_times_the_live_cap(tmp_path):
    config = tmp_path / "sluice.toml"
    config.write_text("max_keys_per_team = 3\n")
    assert load_settings(str(config)).key_records_cap == 12
    config.write_text("max_keys_per_team = 3\nmax_key_records_per_team = 5\n")
    assert load_settings(str(config)).key_records_cap == 5
