"""One exception type for bad input, so the CLI can print it without a traceback."""


class OutletsError(ValueError):
    """Bad input or state whose message names the file, row or field, and the fix."""
