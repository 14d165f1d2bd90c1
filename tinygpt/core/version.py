"""The version, in one place: the package, the CLI's version flag and pyproject.toml read it."""
__version__ = "0.1.0"
