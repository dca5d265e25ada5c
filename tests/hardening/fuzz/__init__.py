"""Fuzz campaign: damaged storages opened, read, verified and loaded."""
