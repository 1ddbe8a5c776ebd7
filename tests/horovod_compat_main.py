"""Run a Horovod script on raylight.horovod even where real Horovod is installed (the import
hook steps aside there): ``python tests/horovod_compat_main.py SCRIPT ARGS``. For tests that
compare the two on the same script."""

import os
import runpy
import sys

import raylight.horovod

sys.modules["horovod.torch"] = raylight.horovod
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
runpy.run_path(sys.argv[0], run_name="__main__")
