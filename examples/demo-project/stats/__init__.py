"""Small statistics helpers."""

from stats.core import mean, median

__all__ = ["mean", "median"]
