"""run.py's error contract: any config that cannot be used ends with exit code 2 and one line on stderr,
whether Hydra rejects it while composing or graft-lab's validation does."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

EXIT_BAD_INPUT = 2


def fail(message: str) -> NoReturn:
    print(f"graft-lab: error: {message}", file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


def one_line(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc.__cause__, OmegaConfBaseException):
        text += "\n" + str(exc.__cause__).split("\n")[0]
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def main_with_clean_errors(main: Callable[[], None]) -> None:
    """Call a @hydra.main function; composition errors (unknown key, unknown option, bad override syntax)
    become one line and exit 2 instead of Hydra's multi-line report and exit 1."""
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let Hydra raise instead of printing
    try:
        main()
    except (HydraException, OmegaConfBaseException) as exc:
        fail(one_line(exc))
