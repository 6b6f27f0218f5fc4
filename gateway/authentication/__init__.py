"""How an HTTP request proves who it is: the auth middleware, the team header, guards."""
