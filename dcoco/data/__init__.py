"""Data: corpora the trainers read."""
