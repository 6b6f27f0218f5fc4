"""What a team's owners can make the identity store keep, bounded per team and expiring (issue #43's rule:
everything a tenant can make us store is bounded, counted against the team and expires).

- Key records. Live keys are capped apart (`max_keys_per_team`, auth/team_keys.py); a revoked, expired or
  rotated-out key stays on record `key_retention_s` after it ended (its name labels the team's usage, the
  audit trail, the answer `revoked_api_key`), then is swept, a batch at a time, as keys are made or rotated.
  A team holds at most `key_records` records, live and ended together: an owner's create or rotation past it
  is refused (409 `too_many_key_records`, saying when the oldest ended one leaves), never answered by
  dropping records early. The operator is not capped. Admin keys are the operator's: never swept nor counted.
- Audit entries expire `audit_retention_s` after they were written, swept as new ones are written. Each entry
  a team's people cause is counted against that team; once `audit_per_day` were written in the last 24 hours,
  the owners' further audited changes are refused (429 `too_many_changes` with Retry-After) until the oldest
  leaves the window. Refusing, rather than deleting the oldest entries, is the point: a flood can neither grow
  the log past the budget times the retention nor push the trail of the flooder's own recent actions out of
  it. Changes that take power away (revoking a live key, blocking a key, removing a member, withdrawing an
  invitation) and accepting an invitation are counted but never refused: a leaked owner key that spent the
  budget must not keep the real owners from cutting it off. Each of those writes an entry only when it
  changed something, so their number is bounded by what the budget let in (keys made, members invited).
"""

from __future__ import annotations

import msgspec

from auth.clock import iso
from auth.errors import RequestError
from auth.models import AuditRecord
from auth.policy import Manager, capped
from auth.store import Store

DAY_S = 86_400.0
SWEEP_BATCH = 200  # ended key records one sweep deletes at most: a write's own work stays small


def audit_id_prefix(at: float) -> str:
    """An audit id's time part: ids are this and a random tail, so ids order like their times, and every entry
    written before `at` has an id below this prefix."""
    return f"{int(at * 1_000_000):016x}"


def _wait(seconds: float) -> str:
    hours = seconds / 3600
    return f"{max(1, round(seconds / 60))} minutes" if hours < 2 else f"{round(hours)} hours"


def counted_team(manager: Manager, team_id: str) -> str | None:
    """The team an audit entry of `manager`'s counts against: the team's own people's; None for the operator."""
    return team_id if capped(manager.is_admin) else None


class RecordBounds(msgspec.Struct, frozen=True):
    key_records: int | None = None  # key records (live and ended) an owner may grow a team to; None: no cap
    key_retention_s: float = 90 * DAY_S  # an ended key's record is kept this long after it ended
    audit_retention_s: float = 366 * DAY_S  # an audit entry is kept this long
    audit_per_day: int | None = None  # audit entries a team's people may cause per 24 hours; None: no budget

    async def sweep_keys(self, tx: Store, team_id: str, at: float) -> None:
        """Delete records of keys ended before the retention: the team's first (so its cap sees them gone),
        then anyone's (so a team that stopped making keys sees its ended ones expire too)."""
        cutoff = at - self.key_retention_s
        for team in (team_id, None):
            await tx.delete_keys(await tx.ended_keys(cutoff, team, SWEEP_BATCH))

    async def check_key_room(self, tx: Store, team_id: str, at: float) -> None:
        """409 when the team holds its cap of key records (after the sweep), saying when room frees."""
        if self.key_records is None:
            return
        held = await tx.count_key_records(team_id)
        if held < self.key_records:
            return
        ended = await tx.first_key_end(team_id, at)
        days = self.key_retention_s / DAY_S
        when = (f"the oldest leaves the record at {iso(max(ended + self.key_retention_s, at))}" if ended is not None
                else "revoke keys to have them leave it")
        raise RequestError(409, "too_many_key_records", f"This team holds {held} key records, the most it may "
                           f"(max_key_records_per_team): live keys, and revoked or expired ones, which stay on record "
                           f"{days:g} days after they end; {when}.", None)

    async def audit(self, tx: Store, entry: AuditRecord, team_id: str | None, *, refusable: bool = True) -> None:
        """Write `entry`, counted against `team_id` (None: the operator's or the system's entry, not counted),
        after sweeping the expired ones; 429 first when it is refusable and the team spent its day's budget.
        Called inside the change's transaction: a refusal rolls the change back with it."""
        await tx.delete_audit_before(audit_id_prefix(entry.at - self.audit_retention_s))
        if refusable and team_id is not None and self.audit_per_day is not None:
            count, oldest = await tx.count_team_audit(team_id, entry.at - DAY_S)
            if count >= self.audit_per_day:
                wait = max(1.0, (oldest if oldest is not None else entry.at) + DAY_S - entry.at)
                raise RequestError(429, "too_many_changes", f"This team's people made {count} audited changes in "
                                   "the last 24 hours, the most a team may (team_audit_entries_per_day): try again "
                                   f"in {_wait(wait)}. Revoking or blocking keys and removing members still work.",
                                   None, retry_after_s=wait)
        await tx.insert_audit(entry, team_id)
