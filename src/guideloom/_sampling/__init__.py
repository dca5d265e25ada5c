"""Orders of samples: the seeded epoch permutation, its split into distributed batches, and many passes at once."""
