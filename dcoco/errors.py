"""User-facing errors: the CLI prints these as one line, without a traceback."""


class DcocoError(Exception):
    """Bad input or a missing resource, described so that a user can fix it."""
