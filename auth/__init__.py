"""Identity for Sluice: API keys, users, teams, memberships, audit log, admin API and CLI.

The gateway uses `AuthService` (auth.service) and mounts `admin_router` (gateway.admin.identity).
"""

from auth.bounds import RecordBounds
from auth.errors import AuthError, RequestError
from auth.models import Limits
from auth.service import AuthService, Bootstrap, Principal

__all__ = ["AuthError", "AuthService", "Bootstrap", "Limits", "Principal", "RecordBounds", "RequestError"]
