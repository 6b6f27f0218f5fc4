"""X-Scale-Up-Timeout parsing (each rule) and how the wait's deadline combines its three bounds."""

from __future__ import annotations

import pytest

from gateway.endpoints.deadline import parse_scale_up_timeout, wait_deadline
from gateway.errors import BadRequest


@pytest.mark.parametrize(("value", "seconds"), [
    (None, None), ("1", 1.0), (" 30 ", 30.0), ("0", 0.0), ("2.5", 2.5), ("86400", 86400.0),
])
def test_accepted_values(value, seconds):
    assert parse_scale_up_timeout(value) == seconds


@pytest.mark.parametrize("value", [
    "", "  ", "-1", "+5", "1e3", "inf", "nan", "Infinity", "1.", ".5", "5s", "1,5", "0x10", "86400.5", "99999999",
    "1" * 13, "½", "１",
])
def test_refused_values_name_the_header(value):
    with pytest.raises(BadRequest) as caught:
        parse_scale_up_timeout(value)
    assert "X-Scale-Up-Timeout" in caught.value.message
    assert caught.value.param == "X-Scale-Up-Timeout" and caught.value.status == 400


def test_the_earliest_bound_wins():
    assert wait_deadline(100.0, 5000.0, max_wait_s=60) == 160.0
    assert wait_deadline(100.0, 5000.0, max_wait_s=60, header_s=1) == 101.0
    assert wait_deadline(100.0, 5000.0, max_wait_s=60, header_s=90) == 160.0
    assert wait_deadline(100.0, 5000.0, max_wait_s=60, header_s=30, request_deadline_unix=5010.0) == 110.0
    assert wait_deadline(100.0, 5000.0, max_wait_s=60, request_deadline_unix=4990.0) == 100.0  # already past
    assert wait_deadline(100.0, 5000.0, max_wait_s=60, request_deadline_unix=float("inf")) == 160.0
