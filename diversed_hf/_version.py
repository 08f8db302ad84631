"""The package version, in one place (pyproject.toml reads it; the package and its exports import it)."""

__version__ = "0.1.0"
