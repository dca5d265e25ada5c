"""Rows of tokens that know their documents: boundaries, packing into rows, and cached packings."""
