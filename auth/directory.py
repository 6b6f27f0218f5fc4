"""Identity as the dashboard reads it, under the rules of auth/policy.py rather than straight from the store:
which teams a signed-in key reaches and its role in each, whether a key is still live, and the names behind
the key and user ids that the usage ledger keeps."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from auth.clock import now
from auth.models import KeyRecord, TeamRecord
from auth.policy import acting_user, named_as_operator, reaches, role_in, sees_every_team
from auth.store import Store

OPERATOR = "operator"


class ReachedTeam(msgspec.Struct, frozen=True):
    id: str
    name: str
    role: str  # auth.policy.role_in: "admin", "owner", "member" or "service"


class Directory:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def live_key(self, key_id: str) -> KeyRecord | None:
        """The key, while it is neither revoked nor expired."""
        key = await self._store.get_key(key_id)
        return key if key is not None and key.is_live(now()) else None

    async def account_signer(self, user_id: str) -> KeyRecord | None:
        """A signed-in account as the dashboard's rules read a signer: a personal key of the user that is no key
        (id `user:<id>`, no secret, no grants of its own), reaching exactly the teams the user belongs to with
        the user's role there. None once the user is gone."""
        user = await self._store.get_user(user_id)
        if user is None:
            return None
        teams = await self._store.teams_of(user_id)
        return KeyRecord(id=f"user:{user_id}", secret_hash="", name=user.name, user_id=user_id,
                         team_id=teams[0] if teams else "", is_admin=False, models=(), limits=None,
                         expires_at=None, revoked_at=None, created_at=user.created_at)

    async def teams_reached(self, key: KeyRecord) -> list[ReachedTeam]:
        """Every team `key` may act in (auth.policy.reaches), by name, with its role there."""
        store = self._store
        user_id = acting_user(key)  # a personal key's user
        personal = user_id is not None
        if sees_every_team(key.is_admin):
            candidates = await store.list_teams()
        else:
            team_ids = set(await store.teams_of(user_id)) if user_id is not None else {key.team_id}
            candidates = [team for team_id in team_ids if (team := await store.get_team(team_id)) is not None]
        blocked = set(await store.blocked_teams(key.id)) if personal else set()
        reached = []
        for team in candidates:
            role = await store.get_role(team.id, user_id) if user_id is not None else None
            if reaches(key, team.id, role, team.id in blocked):
                reached.append(ReachedTeam(team.id, team.name, role_in(key.is_admin, role)))
        return sorted(reached, key=lambda team: team.name)

    async def team(self, team_id: str) -> TeamRecord | None:
        return await self._store.get_team(team_id)

    async def names(self, key_ids: Iterable[str] = (), user_ids: Iterable[str] = (), *,
                    admin_names: bool = False) -> dict[str, str]:
        """The names of the keys and users that still exist (revoked keys keep theirs), by id. An admin key is
        named OPERATOR unless `admin_names` (the viewer is the operator): its name is the platform's, not a
        team's, though admin keys live in the `default` team."""
        names = {}
        for key_id in key_ids:
            if key_id.startswith("user:"):  # an account's own action (auth/sessions.py ACCOUNT)
                if (user := await self._store.get_user(key_id[5:])) is not None:
                    names[key_id] = user.name
                continue
            if (key := await self._store.get_key(key_id)) is not None:
                names[key_id] = OPERATOR if named_as_operator(key.is_admin, admin_names) else key.name
        for user_id in user_ids:
            if (user := await self._store.get_user(user_id)) is not None:
                names[user_id] = user.name
        return names
