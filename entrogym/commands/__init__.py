"""The ``entrogym`` commands, one module per command; the library modules hold no CLI code.

Every module has ``cli(argv) -> int``; its options are a dataclass read by
:mod:`entrogym.commands.options` (the same spellings, ``--config`` YAML and errors everywhere).
"""
