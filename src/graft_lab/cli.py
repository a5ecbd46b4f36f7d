"""run.py's error contract: a config that cannot be used ends with exit code 2 and one line on stderr,
whether Hydra rejects it while composing or graft-lab's validation does; missing weights get a line each.
Ctrl-C outside the decode loop ends with exit code 130 and one line. Also the `${unique:}` resolver that keeps the
run directories of runs started in the same second apart."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable
from typing import NoReturn

from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from .errors import ConfigError, GraftLabError

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
# this process's id and a random tag: fixed for the process, so every resolution of hydra.run.dir agrees
UNIQUE = f"{os.getpid()}-{secrets.token_hex(2)}"
if not OmegaConf.has_resolver("unique"):
    OmegaConf.register_new_resolver("unique", lambda: UNIQUE)


def fail(message: str) -> NoReturn:
    print(f"graft-lab: error: {message}", file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


def message_of(exc: GraftLabError) -> str:
    """A ConfigError's first line (OmegaConf appends full_key/object_type lines); other errors whole."""
    text = str(exc)
    return text.splitlines()[0] if isinstance(exc, ConfigError) and text else text


def one_line(exc: Exception) -> str:
    """Hydra's composition errors, without the advice to append keys or the config search path."""
    cause = exc.__cause__
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and getattr(cause, "full_key", None):
        return f"unknown config key '{cause.full_key}' ({str(cause).splitlines()[0]})"
    text = str(exc).split("Config search path")[0]
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def main_with_clean_errors(main: Callable[[], None]) -> None:
    """Call a @hydra.main function; composition errors (unknown key, unknown option, bad override syntax)
    become one line and exit 2 instead of Hydra's multi-line report and exit 1."""
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let Hydra raise instead of printing
    try:
        main()
    except (HydraException, OmegaConfBaseException) as exc:
        fail(one_line(exc))
    except KeyboardInterrupt:
        print("graft-lab: interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
