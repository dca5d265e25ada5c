"""Soak campaign: long loader runs watched for growing memory, descriptors and processes."""
