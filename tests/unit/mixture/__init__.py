"""Tests of private units, mirroring src/guideloom/_<subpackage>/."""
