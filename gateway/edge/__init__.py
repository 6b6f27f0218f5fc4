"""The HTTP edge: the app factory, its lifespan, the middleware and the probes; it mounts the dialects, the admin
routes and the dashboard."""
