"""Ray's authentication token file, as raylight creates it or relies on it.

Ray (>= 2.60) reads its token from ``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH``
names, else ``~/.ray/auth_token``; a new local cluster with none generates the last with
the process's umask, usually world-readable (0644), and anyone who reads it can run code
in the cluster. So:

- the embedded cluster's start creates the token itself when Ray would (token
  authentication on, no token anywhere): the same 64 hex characters, created 0600 (its
  directory 0700 when raylight makes it), so it is never readable by others even briefly;
- a token file raylight relies on that its group or other users can read is warned about
  once per file, with the fix (``chmod 600 PATH``); raylight does not change a file it did
  not create.

The token itself is never logged. No Ray import: only the file's place and mode.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

log = logging.getLogger("raylight")

TOKEN_ENV = "RAY_AUTH_TOKEN"  # the token itself: no file is read
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
AUTH_MODE_ENV = "RAY_AUTH_MODE"
_warned: set[str] = set()  # the files already warned about in this process


def token_path() -> Path | None:
    """The token file Ray reads here, or None when the token is in ``RAY_AUTH_TOKEN``."""
    if os.environ.get(TOKEN_ENV):
        return None
    given = os.environ.get(TOKEN_PATH_ENV)
    return Path(given).expanduser() if given else Path.home() / ".ray" / "auth_token"


def create_for_new_cluster() -> Path | None:
    """Before a new local cluster starts: create the token file Ray would generate, 0600,
    when token authentication is on (``RAY_AUTH_MODE`` unset or ``token``) and there is no
    token yet; the file created, else None (a token that exists is checked instead)."""
    if os.environ.get(AUTH_MODE_ENV, "token").lower() != "token":
        return None
    path = token_path()
    if path is None or os.environ.get(TOKEN_PATH_ENV) or path.exists():
        warn_if_readable_by_others()
        return None  # Ray does not generate a token at a path the user named either
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it meanwhile: it is theirs
        warn_if_readable_by_others()
        return None
    except OSError as exc:  # Ray will try, and say what is wrong
        log.debug("could not create Ray's token file %s: %s", path, exc)
        return None
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))  # as Ray's own generate_new_authentication_token
    os.chmod(path, 0o600)  # whatever the umask
    return path


def warn_if_readable_by_others() -> None:
    """One warning per file when the token file Ray reads here exists and its group or
    other users may read it."""
    if os.environ.get(AUTH_MODE_ENV, "").lower() == "disabled":
        return
    path = token_path()
    if path is None or str(path) in _warned:
        return
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return
    if mode & 0o077:
        _warned.add(str(path))
        log.warning(
            "Ray's token file %s is open to other users (mode %04o): anyone on this machine "
            "who reads it can run code in your Ray clusters. Run `chmod 600 %s`.",
            path, mode, path,
        )
