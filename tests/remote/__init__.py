"""Storages on object stores: tests against a local S3 server (moto)."""
