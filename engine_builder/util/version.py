"""The trtbuild version: written into every checkpoint, manifest and --json output."""

__version__ = "0.1.0"
