"""The one exception type for bad user input: the CLI prints its message on one line and exits 2."""

from __future__ import annotations


class UsageError(ValueError):
    """Bad input from a user (a file, a field, a shape, a limit). The message names what and why.

    `field` is the path of the offending field inside its document (`layers[0].w_q`, `top_k`) when
    there is one, so callers (the lab answers {"error", "field"}) never parse the message. `status`
    is the HTTP status the lab answers with (400 bad input, 413 over a size limit, 422 well-formed
    but impossible).
    """

    def __init__(self, message: str, field: str | None = None, *, status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.status = status
