"""``python -m raylight.horovod SCRIPT [ARGS...]``: run an unchanged Horovod script with
``import horovod.torch`` served by raylight.horovod (the import hook), under any launcher:
``mpirun -np 2 python -m raylight.horovod train.py``, ``raylight run -n 2 ...``."""

from __future__ import annotations

import runpy
import sys

from raylight.horovod.compat import install_import_hook


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    install_import_hook()
    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
