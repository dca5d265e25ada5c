"""Fault-injection campaign: writers and tokenize runs killed at injected instants."""
