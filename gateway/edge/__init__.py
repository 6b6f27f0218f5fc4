"""The HTTP edge: the app factory, its lifespan, the middleware and the probes; it mounts the dialects, admin and dashboard."""
