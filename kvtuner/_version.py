"""The package version (its own module, so modules below the package root can read it without
importing the package root)."""

__version__ = "0.2.0"
