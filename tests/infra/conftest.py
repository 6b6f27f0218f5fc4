"""Fixtures for the infra checks: terraform on a private copy of infra/terraform, and AWS served
locally by a moto server."""

from __future__ import annotations

import pytest

from tests.infra.terraform import Terraform, skip_reason


@pytest.fixture(scope="session")
def terraform(tmp_path_factory) -> Terraform:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    return Terraform.prepare(tmp_path_factory.mktemp("tf"))
