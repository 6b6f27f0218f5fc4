"""The interface the gateway calls: bootstrap, authenticate, check_model."""

from __future__ import annotations

import pytest

from auth import AuthError, AuthService
from auth.admin import Actor
from auth.models import CreateKey
from tests.auth.helpers import PEPPER


async def test_bootstrap_creates_admin_team_and_first_key(service, boot):
    assert boot.admin_key.startswith("sk-sluice-") and boot.first_key.startswith("sk-sluice-")
    admin = await service.authenticate(f"Bearer {boot.admin_key}", None, "10.0.0.1")
    assert admin.is_admin and admin.team_id == boot.default_team_id
    first = await service.authenticate(f"Bearer {boot.first_key}", None, "10.0.0.1")
    assert not first.is_admin and first.team_id == boot.default_team_id and first.user_id is None
    assert [t.name for t in await service.admin.list_teams()] == ["default"]


async def test_bootstrap_is_idempotent_across_restarts(store_url, service, boot):
    again = await service.bootstrap(None)
    assert again.admin_key is None and again.first_key is None
    assert again.default_team_id == boot.default_team_id
    restarted = await AuthService.open(store_url, PEPPER)
    try:
        third = await restarted.bootstrap("x" * 40)  # a later SLUICE_ADMIN_KEY registers nothing
        assert (third.admin_key, third.first_key) == (None, None)
        assert third.default_team_id == boot.default_team_id
        assert len(await restarted.admin.list_keys()) == 2
        with pytest.raises(AuthError):
            await restarted.authenticate("Bearer " + "x" * 40, None, "c")
    finally:
        await restarted.close()


async def test_bootstrap_registers_given_admin_key(service):
    given = "operator-chosen-admin-key-0123456789-abcdef"
    result = await service.bootstrap(given)
    assert result.admin_key is None and result.first_key is not None  # the operator already knows theirs
    principal = await service.authenticate(f"Bearer {given}", None, "c")
    assert principal.is_admin


async def test_bootstrap_rejects_a_weak_admin_key(service):
    with pytest.raises(ValueError, match="SLUICE_ADMIN_KEY"):
        await service.bootstrap("short")


@pytest.mark.parametrize("header", [None, "", "Basic abc", "Bearer", "Bearer sk-sluice-nothex-xyz",
                                    "Bearer sk-sluice-000000000000-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"])
async def test_missing_malformed_or_unknown_key_is_401(service, boot, header):
    with pytest.raises(AuthError) as info:
        await service.authenticate(header, None, "c")
    assert info.value.status == 401


async def test_wrong_secret_for_a_known_id_is_401(service, boot):
    wrong = boot.first_key[:-4] + ("aaaa" if not boot.first_key.endswith("aaaa") else "bbbb")
    with pytest.raises(AuthError) as info:
        await service.authenticate(f"Bearer {wrong}", None, "c")
    assert (info.value.status, info.value.code) == (401, "invalid_api_key")


async def test_check_model(service, boot):
    principal = await service.authenticate(f"Bearer {boot.first_key}", None, "c")
    service.check_model(principal, "anything")  # empty list = all models
    created = await service.admin.create_key(Actor("test", "test"), CreateKey(
        name="narrow", team_id=boot.default_team_id, models=["m1"]))
    narrow = await service.authenticate(f"Bearer {created.key}", None, "c")
    service.check_model(narrow, "m1")
    with pytest.raises(AuthError) as info:
        service.check_model(narrow, "m2")
    assert (info.value.status, info.value.code) == (403, "permission_denied")
