"""Text as the places that show it can hold it."""

from __future__ import annotations


def one_line(text: object, limit: int = 500) -> str:
    """An exception or error as one line: what a table cell or a condition message can hold."""
    return " ".join(str(text).split())[:limit]
