"""The per-team usage dashboard: server-rendered pages under /dashboard (Litestar templates + HTMX)."""
