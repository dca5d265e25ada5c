"""Hardening campaigns: each with a harness of its own lives in a folder, ``harness.py`` next to its test."""
