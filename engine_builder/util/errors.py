"""Error types. Every user-facing failure is a TrtbuildError whose message says what to do next."""


class TrtbuildError(Exception):
    """Base class: the CLI prints the message on one line and exits 2."""


class InputError(TrtbuildError):
    """The user's input (files, flags, values) cannot be used as given."""


class UnsupportedError(TrtbuildError):
    """A valid input that this version cannot handle (architecture, dtype, op...)."""


class ConfigError(TrtbuildError):
    """A config or recipe file has unknown keys or bad values."""


class CapacityError(TrtbuildError):
    """A request does not fit the engine's fixed limits (KV cache slots, max sequence length)."""
