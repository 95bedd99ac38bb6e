"""The base of the errors a user can fix: a wrong dataset, config value, file, disk or lock.

The console scripts print such an error's message alone and exit with status 1; any other exception
is a bug and keeps its traceback. Each error class lives beside the code that raises it and also
derives from the built-in type callers already catch (ValueError, OSError, ...).
"""
from __future__ import annotations


class UserError(Exception):
    """An expected error whose message says what is wrong and how to fix it."""


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder a setting names (a checkpoint, a table, weights) is not there; the message says
    which setting and what it should name."""
