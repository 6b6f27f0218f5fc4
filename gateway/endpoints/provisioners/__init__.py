"""Provisioners start and stop an endpoint's replicas; the controller drives them through one interface."""
