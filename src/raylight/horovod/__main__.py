"""``python -m raylight.horovod SCRIPT [ARGS...]``: run an unchanged Horovod script with
``import horovod.torch`` served by raylight.horovod (the import hook), under any launcher:
``mpirun -np 2 python -m raylight.horovod train.py``, ``raylight run -n 2 -m raylight.horovod
train.py``. The script runs as ``python SCRIPT`` would run it (``__main__``, its directory
first on ``sys.path``, ``sys.argv``), and under ``raylight run`` or torchrun with Horovod's
and Open MPI's rank variables set as horovodrun and mpirun set them. Where real Horovod is installed the script still gets
raylight.horovod: this command asks for it (run ``python SCRIPT`` for real Horovod)."""

from __future__ import annotations

import os
import runpy
import sys

from raylight.worker.hvd.compat import install_import_hook, set_rank_variables


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    script = argv[0]
    if not os.path.isfile(script):
        print(f"python -m raylight.horovod: {script!r} is not a file; give the Horovod script to run", file=sys.stderr)
        return 2
    install_import_hook(force=True)
    set_rank_variables()  # under raylight run or torchrun: HOROVOD_RANK, OMPI_COMM_WORLD_RANK, ...
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
