"""How every ``sharedfs`` command ends: the exit statuses they share and the one line a user's error gets."""

from __future__ import annotations

import sys

#: Exit statuses every command shares (``sharedfs COMMAND --help`` and docs/cli.md say which others it has).
EXIT_OK = 0
#: A bad setting (``SHAREDFS_*``, the ``SHAREDFS_CONFIG`` file), a bad argument, a path that cannot be used.
EXIT_USAGE = 2
#: stdout was closed before everything was written (``sharedfs status | head -1``), as a shell
#: reports a program ended by SIGPIPE (128 + 13); nothing is printed about it.
EXIT_PIPE = 141
#: Interrupted (Ctrl-C), as a shell reports a program ended by SIGINT (128 + 2).
EXIT_INTERRUPTED = 130


def error_line(exc: BaseException) -> str | None:
    """One line for an error that is the user's situation (a setting, a path), or None for a bug of ours."""
    from sharedfs.errors import ConfigError, SharedFSError

    text = " ".join(str(exc).split())  # one line, whatever the message's own line breaks
    if isinstance(exc, ConfigError):
        return f"{text}; {setting_fix(exc.origin)}"
    if isinstance(exc, SharedFSError):
        return text
    if isinstance(exc, OSError):
        return text or type(exc).__name__
    return None


def setting_fix(origin: str) -> str:
    """What to do about a bad setting, given where it was read (a variable, or ``FILE: key``)."""
    if origin.startswith("SHAREDFS_"):
        return f"fix or unset {origin} (docs/settings.md lists every setting)"
    file, _, key = origin.rpartition(": ")
    if file:
        return f"fix or remove `{key}` in {file} (the file SHAREDFS_CONFIG names; docs/settings.md)"
    return f"fix {origin} (docs/settings.md lists every setting)"


def stderr_line(line: str) -> None:
    """Say ``line`` on stderr now (after what stdout showed); a closed stderr leaves nothing to tell."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:  # stderr closed too: nothing left to tell
        pass
