"""Accounts and memberships in the auth service, on SQLite and PostgreSQL: scrypt hashes, the sign-in throttle per
account and per address, one-time links that expire, invitations bounded per team, the last owner kept, and no
owner acting on another team."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from auth import accounts as accounts_module
from auth import memberships as memberships_module
from auth.accounts import normal_email
from auth.admin import Actor
from auth.errors import AuthError, RequestError
from auth.models import CreateTeam, CreateUser, PutMember
from auth.passwords import HASHES_WAITING, hash_password, verify
from auth.policy import Manager

CLI = Actor("cli:test", "cli")
PASSWORD = "correct horse battery"


def test_a_password_hash_is_salted_scrypt_and_checks_only_its_password():
    one, two = hash_password(PASSWORD), hash_password(PASSWORD)
    assert one != two and one.startswith("scrypt$15$8$1$")  # N = 2**15, r = 8, p = 1, a salt each
    assert verify(PASSWORD, one) and not verify(PASSWORD + "!", one)
    assert not verify(PASSWORD, None) and not verify(PASSWORD, "scrypt$garbage")
    assert not verify("x" * 10_000, one)  # refused before hashing


@pytest.mark.parametrize("raw", ["", "no-at-sign", "a@b", "a b@example.com", "x" * 250 + "@example.com",
                                 "<a@example.com>", None, 7])
def test_an_address_that_is_not_one_is_refused(raw):
    with pytest.raises(RequestError) as caught:
        normal_email(raw)
    assert caught.value.status == 400 and caught.value.code == "invalid_email"


async def _team_with_owner(service, name: str, email: str) -> tuple[str, str]:
    """A team and its owner, who joined by invitation (the account's only way in): (team id, user id)."""
    team = await service.admin.create_team(CLI, CreateTeam(name=name))
    operator = Manager(user_id=None, is_admin=True, role="admin")
    token = await service.memberships.invite(CLI, operator, team.id, email, "owner")
    user_id, joined = await service.memberships.accept(token, "Owner", PASSWORD, "test")
    assert joined == team.id
    return team.id, user_id


async def test_sign_in_checks_the_password_and_throttles_the_account(service):
    await _team_with_owner(service, "A", "ann@example.com")
    assert await service.accounts.sign_in("ann@example.com", PASSWORD, "10.0.0.1")
    for _ in range(accounts_module.ACCOUNT_FAILURES):
        with pytest.raises(AuthError) as wrong:
            await service.accounts.sign_in("ann@example.com", "not the password", "10.0.0.1")
        assert wrong.value.status == 401
    with pytest.raises(AuthError) as throttled:  # even the right password: a guesser learns nothing
        await service.accounts.sign_in("ann@example.com", PASSWORD, "10.0.0.2")
    assert throttled.value.status == 429 and throttled.value.retry_after > 0
    with pytest.raises(AuthError) as unknown:  # an unknown address answers as a wrong password
        await service.accounts.sign_in("nobody@example.com", PASSWORD, "10.0.0.3")
    assert unknown.value.status == 401 and unknown.value.message == wrong.value.message


async def test_sign_in_throttles_an_address_across_accounts(service, monkeypatch):
    monkeypatch.setattr(accounts_module, "CLIENT_FAILURES", 3)
    await _team_with_owner(service, "A", "ann@example.com")
    for n in range(3):
        with pytest.raises(AuthError):
            await service.accounts.sign_in(f"guess{n}@example.com", "wrong password", "2001:db8::1")
    with pytest.raises(AuthError) as throttled:  # the same /64, another account
        await service.accounts.sign_in("ann@example.com", PASSWORD, "2001:db8::2")
    assert throttled.value.status == 429
    assert await service.accounts.sign_in("ann@example.com", PASSWORD, "10.9.9.9")  # another address signs in


async def test_links_work_once_and_expire(service, monkeypatch):
    _, user_id = await _team_with_owner(service, "A", "ann@example.com")
    assert await service.accounts.request_link("sign_in", "nobody@example.com", "10.0.0.1") is None
    token = await service.accounts.request_link("sign_in", "ann@example.com", "10.0.0.1")
    assert await service.accounts.use_sign_in_link(token) == user_id
    with pytest.raises(RequestError) as again:
        await service.accounts.use_sign_in_link(token)
    assert again.value.code == "link_expired"
    late = await service.accounts.request_link("reset", "ann@example.com", "10.0.0.1")
    monkeypatch.setattr(accounts_module, "now", lambda: time.time() + accounts_module.RESET_TTL_S + 1)
    with pytest.raises(RequestError):
        await service.accounts.reset_password(late, "a brand new password")
    monkeypatch.undo()
    with pytest.raises(RequestError) as sign_in_as_reset:  # a link serves its own purpose only
        await service.accounts.use_sign_in_link(late)
    assert sign_in_as_reset.value.code == "link_expired"
    assert await service.accounts.request_link("reset", "ann@example.com", "10.0.0.2")  # the third this window
    with pytest.raises(AuthError) as flooded:  # too many links to one address
        await service.accounts.request_link("reset", "ann@example.com", "10.0.0.3")
    assert flooded.value.status == 429 and flooded.value.code == "too_many_links"


async def test_a_reset_sets_the_password_and_ends_every_session(service):
    from auth.sessions import SessionStore
    _, user_id = await _team_with_owner(service, "A", "ann@example.com")
    sessions = SessionStore(service)
    kept = await sessions.start(user_id=user_id, client="10.0.0.1", agent="test")
    token = await service.accounts.request_link("reset", "ann@example.com", "10.0.0.1")
    with pytest.raises(RequestError) as weak:
        await service.accounts.reset_password(token, "short")
    assert weak.value.code == "weak_password"  # and the link still works:
    assert await service.accounts.reset_password(token, "a brand new password") == user_id
    assert not (await sessions.get(kept.id)).signed_in
    assert await service.accounts.sign_in("ann@example.com", "a brand new password", "10.0.0.1") == user_id


async def test_owners_run_their_own_team_only_and_keep_an_owner(service, monkeypatch):
    a, ann = await _team_with_owner(service, "A", "ann@example.com")
    b, bob = await _team_with_owner(service, "B", "bob@example.com")
    owner_a = Manager(user_id=ann, is_admin=False, role="owner")
    actor = Actor(f"user:{ann}", "test")
    with pytest.raises(RequestError) as crossing:  # B's owner, seen from team A: not a member here
        await service.memberships.remove(actor, owner_a, a, bob)
    assert crossing.value.status == 404
    with pytest.raises(AuthError):  # acting in B with a role Ann does not have there
        await service.memberships.invite(actor, Manager(user_id=ann, is_admin=False, role=None), b,
                                         "eve@example.com", "member")
    with pytest.raises(RequestError) as last:
        await service.memberships.set_role(actor, owner_a, a, ann, "member")
    assert last.value.code == "last_owner"
    with pytest.raises(RequestError):
        await service.memberships.remove(actor, owner_a, a, ann)
    with pytest.raises(RequestError) as bad_role:
        await service.memberships.invite(actor, owner_a, a, "cy@example.com", "admin")
    assert bad_role.value.code == "invalid_role"
    token = await service.memberships.invite(actor, owner_a, a, "cy@example.com", "member")
    with pytest.raises(RequestError) as weak:
        await service.memberships.accept(token, "Cy", "short", "test")
    assert weak.value.code == "weak_password"
    cy, _ = await service.memberships.accept(token, "Cy", PASSWORD, "test")
    with pytest.raises(RequestError):  # once
        await service.memberships.accept(token, "Cy", PASSWORD, "test")
    await service.memberships.set_role(actor, owner_a, a, cy, "owner")
    await service.memberships.set_role(actor, owner_a, a, ann, "member")  # another owner remains
    assert await service.store.get_role(a, ann) == "member" and await service.store.get_role(b, bob) == "owner"
    actions = [e.action for e in await service.admin.audit(100)]
    assert {"members.invite", "members.join", "members.role"} <= set(actions)


async def test_pending_invitations_are_bounded(service, monkeypatch):
    monkeypatch.setattr(memberships_module, "MAX_PENDING_INVITES", 2)
    a, ann = await _team_with_owner(service, "A", "ann@example.com")
    owner = Manager(user_id=ann, is_admin=False, role="owner")
    actor = Actor(f"user:{ann}", "test")
    await service.memberships.invite(actor, owner, a, "one@example.com", "member")
    await service.memberships.invite(actor, owner, a, "two@example.com", "member")
    with pytest.raises(RequestError) as full:
        await service.memberships.invite(actor, owner, a, "three@example.com", "member")
    assert full.value.code == "too_many_invites" and full.value.status == 409
    with pytest.raises(RequestError) as member:
        await service.memberships.invite(actor, owner, a, "ann@example.com", "member")
    assert member.value.code == "already_member"
    invite_id, _ = (await service.memberships.pending(a))[0]
    b, bob = await _team_with_owner(service, "B", "bob@example.com")
    with pytest.raises(RequestError):  # B's owner cannot withdraw A's invitation
        await service.memberships.withdraw(Actor(f"user:{bob}", "t"), Manager(bob, False, "owner"), b, invite_id)
    await service.memberships.withdraw(actor, owner, a, invite_id)
    assert len(await service.memberships.pending(a)) == 1


async def test_an_operator_made_user_gets_an_account_by_invitation(service):
    """A user the operator made (no account yet) is another person than an invited address: the invitation makes
    a new user with the account; the operator's user keeps their keys."""
    made = await service.admin.create_user(CLI, CreateUser(name="old"))
    team = await service.admin.create_team(CLI, CreateTeam(name="T"))
    await service.admin.put_member(CLI, team.id, made.id, PutMember(role="owner"))
    token = await service.memberships.invite(CLI, Manager(None, True, "admin"), team.id, "new@example.com", "member")
    user_id, _ = await service.memberships.accept(token, "", PASSWORD, "test")
    assert user_id != made.id and (await service.store.get_user(user_id)).name == "new"


async def test_password_hashes_run_off_the_loop_and_a_flood_is_refused_not_queued(service, monkeypatch):
    """Guesses sent at once from many addresses (each under its own throttle) are hashed on threads, a few at a
    time; past HASHES_WAITING the rest get 429 at once instead of taking the gateway's cores and memory."""
    await _team_with_owner(service, "A", "ann@example.com")
    loop_thread, hashed_on = threading.get_ident(), set()
    real_verify = accounts_module.verify

    def watched_verify(password, stored):
        hashed_on.add(threading.get_ident())
        return real_verify(password, stored)

    monkeypatch.setattr(accounts_module, "verify", watched_verify)
    flood = HASHES_WAITING + 8
    outcomes = await asyncio.gather(*(service.accounts.sign_in(f"u{i}@example.com", PASSWORD, f"10.1.{i}.1")
                                      for i in range(flood)), return_exceptions=True)
    assert all(isinstance(o, AuthError) for o in outcomes)
    busy = [o for o in outcomes if o.code == "too_many_sign_ins"]
    assert len(busy) == flood - HASHES_WAITING and all(o.status == 429 and o.retry_after for o in busy)
    assert [o.status for o in outcomes if o not in busy] == [401] * HASHES_WAITING
    assert hashed_on and loop_thread not in hashed_on
    assert await service.accounts.sign_in("ann@example.com", PASSWORD, "10.0.0.9")  # the flood left no debt
