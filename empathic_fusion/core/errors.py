"""The base of the errors a user can fix: a wrong dataset, config value, file, disk or lock.

The console scripts print such an error's message alone and exit with status 1; any other exception
is a bug and keeps its traceback. Each error class lives beside the code that raises it and also
derives from the built-in type callers already catch (ValueError, OSError, ...).
"""
from __future__ import annotations

import difflib
from collections.abc import Callable


def did_you_mean(wrong: str, choices: list[str], spell: Callable[[str], str] = repr, n: int = 3) -> str:
    """"; did you mean A or B?" with the up to n choices closest to `wrong` (difflib), each as `spell` writes
    it; "" when none is close."""
    close = difflib.get_close_matches(str(wrong), list(choices), n=n)
    return f"; did you mean {' or '.join(spell(c) for c in close)}?" if close else ""


class UserError(Exception):
    """An expected error whose message says what is wrong and how to fix it."""


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder a setting names (a checkpoint, a table, weights) is not there; the message says
    which setting and what it should name."""
