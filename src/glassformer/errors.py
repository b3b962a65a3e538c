"""The one exception type for bad user input: the CLI prints its message on one line and exits 2."""


class UsageError(ValueError):
    """Bad input from a user (a file, a field, a shape, a limit). The message names what and why."""
