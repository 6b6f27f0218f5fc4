"""Management APIs: the operator's /admin routes, a team's /v1/team and /v1/usage routes."""
