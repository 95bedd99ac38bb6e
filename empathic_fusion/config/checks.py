"""The error every config check raises, and the helper the schemas' `__post_init__` use to build it."""
from __future__ import annotations

import math
from typing import Any

from empathic_fusion.core.errors import UserError

class ConfigError(UserError, ValueError):
    """One or more settings out of their allowed range or choices; the message lists each as
    `key=value: must be ...`."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid settings:\n  " + "\n  ".join(self.problems))


def require(prefix: str, obj: Any, rules: dict[str, tuple[bool, str]]) -> None:
    """Raise ConfigError naming `prefix.field=value` and what is allowed for every rule that fails.

    `rules` maps a field of `obj` to (whether its value is allowed, what is allowed); an empty `prefix`
    names top-level keys (`seed=...`)."""
    problems = [f"{prefix + '.' if prefix else ''}{name}={getattr(obj, name)}: must be {allowed}"
                for name, (ok, allowed) in rules.items() if not ok]
    if problems:
        raise ConfigError(problems)


def finite(value: Any) -> bool:
    """A real number (not bool, NaN or infinite)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def one_of(choices: tuple[str, ...]) -> str:
    """`a, b or c` for a message."""
    return ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else choices[0]
