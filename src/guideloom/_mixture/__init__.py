"""Mixtures: several storages read as one in exact proportions, on a schedule, and their sample source."""
