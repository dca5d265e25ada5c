"""The bottom layer: argument checks, the error classes and the words of messages; imports nothing of guideloom."""
