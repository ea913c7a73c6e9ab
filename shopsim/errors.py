"""User-facing errors.

`ShopsimError` (and its subclasses) carry a message that says what to change. The CLI prints such a message on
one line and exits non-zero without a traceback; library callers catch it like any `ValueError`.
"""

from __future__ import annotations


class ShopsimError(ValueError):
    """A bad argument, config or file: the message says what to change."""


class ConfigError(ShopsimError):
    """An invalid configuration value or combination."""


class UnknownNameError(ShopsimError, KeyError):
    """An unknown registry name (env, agent, algorithm); the message lists the available ones."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DatasetError(ShopsimError):
    """A dataset file that is missing, incomplete, malformed or of an unsupported schema."""
