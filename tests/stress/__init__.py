"""Long runs of the hardening campaigns, started by hand: ``python -m tests.stress.run_<campaign>``."""
