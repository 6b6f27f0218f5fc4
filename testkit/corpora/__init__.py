"""Inputs that tests and benches share: the grammar corpus and the tool-calling corpus."""
