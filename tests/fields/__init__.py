"""Records of a RecordSchema: typed fields, media, lazy values, lengths, decoding in the loader."""
