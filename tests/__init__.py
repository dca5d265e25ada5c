"""The guideloom test suite: a package, so tests import shared code as ``tests.helpers``."""
