"""Owners running their team's members: invite by e-mail, change roles, remove, withdraw an invitation.

The rule is auth/policy.py's `check_manages` (the team's owners and the operator), applied to the team the
caller acts in: every statement names that team, so an owner of A cannot reach a member or invitation of B
(404, as if it did not exist). A team keeps at least one owner: the last owner is neither demoted nor removed
(409 `last_owner`), decided inside the identity transaction so two owners demoting each other cannot both win.
An invitation is a one-time e-mail link (auth/accounts.py's tokens) that expires after INVITE_TTL_S; a team
holds at most MAX_PENDING_INVITES unused ones. Accepting it creates the account (with the password given) or
attaches the existing one, and adds the membership. Every change is in the audit log with the team's id.
"""

from __future__ import annotations

from collections.abc import Callable

from auth.accounts import LINK_GONE, hashed, new_token, settable_password, token_hash
from auth.admin import Actor, audit_entry, new_id
from auth.bounds import RecordBounds, counted_team
from auth.clock import now
from auth.errors import RequestError
from auth.models import ROLES, AccountRecord, LinkRecord, MemberRecord, UserRecord
from auth.passwords import Hashing, hash_password
from auth.policy import Manager, check_manages, is_owner
from auth.store import Store

INVITE_TTL_S = 7 * 86400.0
MAX_PENDING_INVITES = 50
NAME_MAX = 200


def _role(role: object) -> str:
    if role not in ROLES:
        raise RequestError(400, "invalid_role", f"role must be one of {', '.join(ROLES)}.", "role")
    return str(role)


def _name(name: object, email: str) -> str:
    text = name.strip() if isinstance(name, str) else ""
    if len(text) > NAME_MAX:
        raise RequestError(400, "invalid_name", f"name has at most {NAME_MAX} characters.", "name")
    return text or email.split("@", 1)[0]


class Memberships:
    def __init__(self, store: Store, forget: Callable[..., None], hashing: Hashing,
                 bounds: RecordBounds | None = None) -> None:
        self._store = store
        self._forget = forget
        self._hashing = hashing
        self._bounds = bounds or RecordBounds()  # the team's audit budget (auth/bounds.py)

    async def invite(self, actor: Actor, manager: Manager, team_id: str, email: str, role: object) -> str:
        """The invitation's token (the caller mails the link); 409 when the address is already a member or the
        team has MAX_PENDING_INVITES pending."""
        check_manages(manager)
        role = _role(role)
        at = now()
        token = new_token()
        async with self._store.transaction() as tx:
            if await tx.get_team(team_id) is None:
                raise RequestError(404, "team_not_found", "No such team.", "team_id")
            account = await tx.account_by_email(email)
            if account is not None and await tx.get_role(team_id, account.user_id) is not None:
                raise RequestError(409, "already_member", f"{email} is already a member of this team.", "email")
            pending = await tx.pending_invites(team_id, at)
            if len(pending) >= MAX_PENDING_INVITES:
                raise RequestError(409, "too_many_invites", f"A team has at most {MAX_PENDING_INVITES} pending "
                                   "invitations; withdraw some first.", "email")
            await tx.insert_link(token_hash(token), LinkRecord("invite", email, team_id, role, actor.id, at,
                                                               at + INVITE_TTL_S))
            await self._bounds.audit(tx, audit_entry(actor, "members.invite", team_id,
                                                     {"team_id": team_id, "email": email, "role": role}),
                                     counted_team(manager, team_id))
        return token

    async def pending(self, team_id: str) -> list[tuple[str, LinkRecord]]:
        return await self._store.pending_invites(team_id, now())

    async def withdraw(self, actor: Actor, manager: Manager, team_id: str, invite_id: object) -> None:
        check_manages(manager)
        if not isinstance(invite_id, str) or len(invite_id) != 64:
            raise RequestError(404, "invite_not_found", "No such pending invitation.", "invite")
        async with self._store.transaction() as tx:
            if not await tx.cancel_invite(team_id, invite_id, now()):
                raise RequestError(404, "invite_not_found", "No such pending invitation.", "invite")
            await self._bounds.audit(tx, audit_entry(actor, "members.withdraw", team_id, {"team_id": team_id}),
                                     counted_team(manager, team_id), refusable=False)  # takes power away

    async def peek(self, token: object) -> LinkRecord | None:
        if not isinstance(token, str) or len(token) > 100:
            return None
        return await self._store.peek_link(token_hash(token), "invite", now())

    async def accept(self, token: object, name: object, password: object, source: str) -> tuple[str, str]:
        """(user id, team id): the invited address's account (made now with `password`, or the existing one,
        which sets `password` if it had none) joins the team with the invited role (a member already there
        keeps theirs). The link works once."""
        if not isinstance(token, str) or len(token) > 100 or (invited := await self.peek(token)) is None:
            raise RequestError(400, "link_expired", LINK_GONE)
        # the new password hashed off the loop and outside the transaction, only for a good link (a refusal
        # keeps the link); the transaction below looks again, and sets it only where none is set yet
        known = await self._store.account_by_email(invited.email)
        new_hash = None
        if known is None or known.password_hash is None:
            new_hash = await hashed(self._hashing, hash_password, settable_password(password))
        async with self._store.transaction() as tx:
            link = await tx.peek_link(token_hash(token), "invite", now())
            if link is None or link.team_id is None:
                raise RequestError(400, "link_expired", LINK_GONE)
            account = await tx.account_by_email(link.email)
            needs_password = account is None or account.password_hash is None
            if needs_password and new_hash is None:  # an account that lost its password meanwhile
                raise RequestError(400, "link_expired", LINK_GONE)
            password_hash = new_hash if needs_password else None
            display_name = _name(name, link.email)
            await tx.use_link(token_hash(token), "invite", now())
            at = now()
            if account is None:
                user = UserRecord(new_id("user"), display_name, at)
                await tx.insert_user(user)
                account = AccountRecord(user.id, link.email, password_hash, at)
                await tx.insert_account(account)
            elif password_hash is not None:
                await tx.set_password_hash(account.user_id, password_hash)
            if await tx.get_role(link.team_id, account.user_id) is None:
                await tx.upsert_member(MemberRecord(link.team_id, account.user_id, link.role or "member", at))
            # counted, never refused: the invitation that let it in was (and is used once)
            await self._bounds.audit(tx, audit_entry(Actor(f"user:{account.user_id}", source), "members.join",
                                                     f"{link.team_id}/{account.user_id}",
                                                     {"team_id": link.team_id, "role": link.role, "email": link.email}),
                                     link.team_id, refusable=False)
        self._forget(team=link.team_id, user=account.user_id)
        return account.user_id, link.team_id

    async def set_role(self, actor: Actor, manager: Manager, team_id: str, user_id: str, role: object) -> None:
        check_manages(manager)
        role = _role(role)
        async with self._store.transaction() as tx:
            await self._demotable(tx, team_id, user_id, staying_owner=is_owner(role))
            await tx.upsert_member(MemberRecord(team_id, user_id, role, now()))
            await self._bounds.audit(tx, audit_entry(actor, "members.role", f"{team_id}/{user_id}",
                                                     {"team_id": team_id, "role": role}),
                                     counted_team(manager, team_id))
        self._forget(team=team_id, user=user_id)

    async def remove(self, actor: Actor, manager: Manager, team_id: str, user_id: str) -> None:
        check_manages(manager)
        async with self._store.transaction() as tx:
            await self._demotable(tx, team_id, user_id, staying_owner=False)
            await tx.delete_member(team_id, user_id)
            await self._bounds.audit(tx, audit_entry(actor, "members.remove", f"{team_id}/{user_id}",
                                                     {"team_id": team_id}),
                                     counted_team(manager, team_id), refusable=False)  # takes power away
        self._forget(team=team_id, user=user_id)

    @staticmethod
    async def _demotable(tx: Store, team_id: str, user_id: str, *, staying_owner: bool) -> None:
        """404 unless `user_id` is a member of `team_id`; 409 when the change would leave the team no owner."""
        role = await tx.get_role(team_id, user_id) if isinstance(user_id, str) and len(user_id) <= 100 else None
        if role is None:
            raise RequestError(404, "member_not_found", "No such member of this team.", "user_id")
        if is_owner(role) and not staying_owner:
            owners = [m for m in await tx.list_members(team_id) if is_owner(m.role)]
            if len(owners) <= 1:
                raise RequestError(409, "last_owner", "A team keeps at least one owner: make another member an "
                                   "owner first.", "user_id")
