"""A worker's error kind becomes the gateway error of the status the worker answers it with (one table,
`common.protocol.ERROR_STATUS`); the worker's own faults are the gateway's 502."""

from __future__ import annotations

import typing

import pytest

from common.protocol import ERROR_STATUS, Error, ErrorKind
from gateway.errors import AdapterUnavailable, ContextTooLong, UpstreamFailed
from gateway.replicas.relay import worker_error

WORKER_FAULTS = {"internal", "unauthorized"}  # not the client's doing: the gateway answers 502


def test_every_kind_has_one_status():
    assert set(ERROR_STATUS) == set(typing.get_args(ErrorKind))


@pytest.mark.parametrize("kind", typing.get_args(ErrorKind))
def test_the_gateway_answers_the_workers_status(kind):
    error = worker_error(Error(kind=kind, message="m", field="prompt"))
    if kind in WORKER_FAULTS:
        assert isinstance(error, UpstreamFailed) and error.status == 502
    else:
        assert error.status == ERROR_STATUS[kind], (kind, type(error).__name__)


def test_the_kinds_that_carry_more_keep_it():
    too_long = worker_error(Error(kind="too_long", message="m", field="prompt", max_context=8, prompt_tokens=9))
    assert isinstance(too_long, ContextTooLong) and (too_long.max_context, too_long.prompt_tokens) == (8, 9)
    assert worker_error(Error(kind="validation", message="m", field="seed")).param == "seed"
    adapter = worker_error(Error(kind="unavailable", message="s3://x", field="adapter", retry_after_s=7.0))
    assert isinstance(adapter, AdapterUnavailable) and adapter.retry_after_s == 7.0 and "s3" not in adapter.message
