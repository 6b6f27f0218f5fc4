"""What a signed-in key may see on the dashboard: its teams, the one on screen and its role there.

A user's key reaches the teams its user belongs to, except those whose owners blocked it there; a service key
its own team; the admin key every team (and the ranking across them). Members see usage; owners (and the
admin) also manage keys. A team the key may not reach answers 404, the same as a team that does not exist,
so existence is not revealed.
"""

from __future__ import annotations

import msgspec

from auth.clock import now
from auth.models import KeyRecord
from auth.service import AuthService
from gateway.errors import NotFound

OWNER = "owner"
ADMIN = "admin"


class TeamChoice(msgspec.Struct, frozen=True):
    id: str
    name: str
    role: str


class DashboardScope(msgspec.Struct, frozen=True):
    key: KeyRecord
    teams: list[TeamChoice]  # the switcher's choices, by name
    team: TeamChoice  # the team on screen

    @property
    def is_admin(self) -> bool:
        return self.key.is_admin

    @property
    def manages_keys(self) -> bool:
        return self.team.role in (OWNER, ADMIN)


def key_is_live(key: KeyRecord | None) -> bool:
    return key is not None and key.revoked_at is None and (key.expires_at is None or key.expires_at > now())


async def teams_of(auth: AuthService, key: KeyRecord) -> list[TeamChoice]:
    store = auth.store
    if key.is_admin:
        return sorted((TeamChoice(t.id, t.name, ADMIN) for t in await store.list_teams()), key=lambda t: t.name)
    if key.user_id is None:
        team = await store.get_team(key.team_id)
        return [TeamChoice(team.id, team.name, "service")] if team is not None else []
    choices = []
    blocked = set(await store.blocked_teams(key.id))  # as the API refuses it there (auth/service.py)
    for team_id in set(await store.teams_of(key.user_id)) - blocked:
        team, role = await store.get_team(team_id), await store.get_role(team_id, key.user_id)
        if team is not None and role is not None:
            choices.append(TeamChoice(team.id, team.name, role))
    return sorted(choices, key=lambda t: t.name)


async def resolve(auth: AuthService, key: KeyRecord, team_id: str | None) -> DashboardScope:
    """The scope for `team_id` (None: the key's default team, else its first); NotFound when unreachable."""
    teams = await teams_of(auth, key)
    wanted = team_id or key.team_id
    team = next((t for t in teams if t.id == wanted), None)
    if team is None and team_id is None and teams:
        team = teams[0]
    if team is None:
        raise NotFound("No such team on this dashboard.", param="team_id", code="team_not_found")
    return DashboardScope(key, teams, team)
