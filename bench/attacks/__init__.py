"""Attacks a hostile tenant can make on a shared gateway, each measured by what another team notices."""
