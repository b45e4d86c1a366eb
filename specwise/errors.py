"""Errors a user can act on. The CLI prints them as one line, never a traceback."""


class SpecwiseError(Exception):
    """Base class: the message is complete and meant for the user."""


class ConfigError(SpecwiseError, ValueError):
    """A setting or flag has a value we cannot use."""


class ModelLoadError(SpecwiseError):
    """A model file or directory cannot be read: names the path and the problem."""

    def __init__(self, path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


class InputError(SpecwiseError, ValueError):
    """A request, workload or trace row we cannot serve."""
