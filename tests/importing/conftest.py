"""The object-storage tests' S3 server, for imports whose sources lie on it."""

from tests.remote.conftest import bucket, s3_server

__all__ = ["bucket", "s3_server"]
