"""The object-storage benchmark's processes: the counting S3 server and the per-library worker."""
