"""Records of named, typed fields, media among them: the implementation behind ``guideloom.fields``."""
