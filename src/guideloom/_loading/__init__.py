"""The loader: its state dict, the batch transport (threads, worker processes, devices) and the source factory."""
