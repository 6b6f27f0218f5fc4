"""What a signed-in key may see on the dashboard: its teams, the one on screen and its role there.

The teams are those the key reaches under auth/policy.py, as the API lets it act in them (`auth.directory`):
a user's key reaches the teams its user belongs to, except those whose owners blocked it there; a service key
its own team; the admin key every team (and the ranking across them). Members see usage; owners (and the
admin) also manage keys, under the same rule as the team API. A team the key may not reach answers 404, the
same as a team that does not exist, so existence is not revealed.
"""

from __future__ import annotations

import msgspec

from auth.directory import ReachedTeam
from auth.models import KeyRecord
from auth.policy import Manager
from auth.service import AuthService
from gateway.errors import NotFound


class DashboardScope(msgspec.Struct, frozen=True):
    key: KeyRecord
    teams: list[ReachedTeam]  # the switcher's choices, by name
    team: ReachedTeam  # the team on screen

    @property
    def is_admin(self) -> bool:
        return self.key.is_admin

    @property
    def is_account(self) -> bool:
        """Signed in to a person's account (auth/directory.py `account_signer`), not with an API key."""
        return self.key.id.startswith("user:")

    @property
    def manager(self) -> Manager:
        """The signed-in key as auth/policy.py judges what it may do to the keys of the team on screen."""
        return Manager(user_id=self.key.user_id, is_admin=self.is_admin, role=self.team.role)

    @property
    def manages_keys(self) -> bool:
        return self.manager.manages_keys


async def resolve(auth: AuthService, key: KeyRecord, team_id: str | None) -> DashboardScope:
    """The scope for `team_id` (None: the key's default team, else its first); NotFound when unreachable."""
    teams = await auth.directory.teams_reached(key)
    wanted = team_id or key.team_id
    team = next((t for t in teams if t.id == wanted), None)
    if team is None and team_id is None and teams:
        team = teams[0]
    if team is None:
        if not teams:
            raise NotFound("Your account belongs to no team yet: ask a team's owner for an invitation.",
                           code="no_team")
        raise NotFound("No such team on this dashboard.", param="team_id", code="team_not_found")
    return DashboardScope(key, teams, team)
