"""Sample sources: the protocol the loader reads and its implementations over one storage."""
