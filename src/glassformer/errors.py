"""The one exception type for bad user input: the CLI prints its message on one line and exits 2; and
`run_command`, which turns whatever a command raises into that line (the CLI's and torchrun's entry points)."""

from __future__ import annotations

import json
import sys


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


def run_command(name: str, work) -> int:
    """Run a command's `work()` and return its exit status; whatever goes wrong is one line on stderr naming
    `glassformer NAME` (bad input 2, Ctrl-C 130, a system that refuses to write 1), never a traceback. Also the
    torchrun entry point's (glassformer.train)."""
    try:
        return work()
    except UsageError as error:
        print(f"glassformer {name}: error: {error}", file=sys.stderr)
        return 2
    except (FileNotFoundError, IsADirectoryError, PermissionError, NotADirectoryError, FileExistsError) as error:
        print(f"glassformer {name}: error: {_os_error(error)}", file=sys.stderr)
        return 2
    except json.JSONDecodeError as error:
        print(f"glassformer {name}: error: invalid JSON: {error}", file=sys.stderr)
        return 2
    except UnicodeDecodeError as error:
        print(f"glassformer {name}: error: input is not UTF-8 text (byte 0x{error.object[error.start]:02x} "
              f"at offset {error.start})", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"glassformer {name}: error: out of memory (the input is too large for this machine)",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"glassformer {name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as error:                         # the system refused: the output cannot be written (a full disk)
        print(f"glassformer {name}: error: {_os_error(error)}", file=sys.stderr)
        return 1


def _os_error(error: OSError) -> str:
    """What the system said, and the file where it names one (an error raised without either: its text)."""
    what = error.strerror or str(error) or type(error).__name__
    return f"{what}: {error.filename}" if error.filename else what
