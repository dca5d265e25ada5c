"""Tests with the training frameworks, each framework imported only by its own test module."""
