"""The one exception type the CLI turns into a single line on stderr and exit code 2."""


class KVTunerError(ValueError):
    """Bad user input (a file, a flag, a model/profile mismatch); the message is one line."""
