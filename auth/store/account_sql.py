"""The auth store's queries for accounts: e-mail sign-ins, one-time e-mail links and the sign-in throttle's
failures (auth/accounts.py, auth/memberships.py use them)."""

from __future__ import annotations

from typing import Any

from auth.models import AccountRecord, LinkRecord
from storage import Executor

_ACCOUNT = "user_id, email, password_hash, created_at"
_LINK = "purpose, email, team_id, role, created_by, created_at, expires_at"


class AccountQueries:
    _x: Executor

    # --- accounts ---
    async def insert_account(self, account: AccountRecord) -> None:
        await self._x.execute(f"INSERT INTO accounts ({_ACCOUNT}) VALUES (?, ?, ?, ?)",
                              (account.user_id, account.email, account.password_hash, account.created_at))

    async def account_by_email(self, email: str) -> AccountRecord | None:
        row = await self._x.fetchone(f"SELECT {_ACCOUNT} FROM accounts WHERE email = ?", (email,))
        return AccountRecord(*row) if row else None

    async def account_of(self, user_id: str) -> AccountRecord | None:
        row = await self._x.fetchone(f"SELECT {_ACCOUNT} FROM accounts WHERE user_id = ?", (user_id,))
        return AccountRecord(*row) if row else None

    async def emails_of(self, user_ids: list[str]) -> dict[str, str]:
        emails = {}
        for user_id in user_ids:
            if (account := await self.account_of(user_id)) is not None:
                emails[user_id] = account.email
        return emails

    async def set_password_hash(self, user_id: str, password_hash: str) -> None:
        await self._x.execute("UPDATE accounts SET password_hash = ? WHERE user_id = ?", (password_hash, user_id))

    # --- one-time links ---
    async def insert_link(self, token_hash: str, link: LinkRecord) -> None:
        await self._x.execute(f"INSERT INTO email_links (token_hash, {_LINK}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                              (token_hash, link.purpose, link.email, link.team_id, link.role, link.created_by,
                               link.created_at, link.expires_at))

    async def peek_link(self, token_hash: str, purpose: str, at: float) -> LinkRecord | None:
        """The link while unused and unexpired, without using it (a page that asks to confirm)."""
        row = await self._x.fetchone(f"SELECT {_LINK} FROM email_links WHERE token_hash = ? AND purpose = ? "
                                     "AND used_at IS NULL AND expires_at > ?", (token_hash, purpose, at))
        return LinkRecord(*row) if row else None

    async def use_link(self, token_hash: str, purpose: str, at: float) -> LinkRecord | None:
        """Marks the link used, in one statement, so that two requests with one token cannot both use it."""
        row = await self._x.fetchone(f"UPDATE email_links SET used_at = ? WHERE token_hash = ? AND purpose = ? "
                                     f"AND used_at IS NULL AND expires_at > ? RETURNING {_LINK}",
                                     (at, token_hash, purpose, at))
        return LinkRecord(*row) if row else None

    async def pending_invites(self, team_id: str, at: float) -> list[tuple[str, LinkRecord]]:
        """(token hash, link) of the team's unused, unexpired invitations, oldest first."""
        rows = await self._x.fetchall(f"SELECT token_hash, {_LINK} FROM email_links WHERE team_id = ? AND "
                                      "purpose = 'invite' AND used_at IS NULL AND expires_at > ? ORDER BY created_at",
                                      (team_id, at))
        return [(row[0], LinkRecord(*row[1:])) for row in rows]

    async def cancel_invite(self, team_id: str, token_hash: str, at: float) -> bool:
        """Withdraws one of the team's own pending invitations (another team's is never matched)."""
        row = await self._x.fetchone("UPDATE email_links SET used_at = ? WHERE token_hash = ? AND team_id = ? AND "
                                     "purpose = 'invite' AND used_at IS NULL RETURNING token_hash",
                                     (at, token_hash, team_id))
        return row is not None

    async def delete_links_before(self, at: float) -> None:
        await self._x.execute("DELETE FROM email_links WHERE expires_at < ?", (at,))

    # --- the sign-in throttle ---
    async def add_failure(self, subjects: list[str], at: float) -> None:
        await self._x.executemany("INSERT INTO sign_in_failures (subject, at) VALUES (?, ?)",
                                  [(subject, at) for subject in subjects])

    async def failures_since(self, subject: str, since: float) -> tuple[int, float | None]:
        """How many failures `subject` had since `since`, and the oldest of them."""
        row: Any = await self._x.fetchone("SELECT COUNT(*), MIN(at) FROM sign_in_failures WHERE subject = ? "
                                          "AND at >= ?", (subject, since))
        return int(row[0]), row[1]

    async def clear_failures(self, subject: str) -> None:
        await self._x.execute("DELETE FROM sign_in_failures WHERE subject = ?", (subject,))

    async def delete_failures_before(self, at: float) -> None:
        await self._x.execute("DELETE FROM sign_in_failures WHERE at < ?", (at,))
