"""Helpers for glowlm's tests and for plugin authors' contract tests."""
