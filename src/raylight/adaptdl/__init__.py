"""AdaptDL's API on raylight: AdaptDL scripts (``import adaptdl.torch as adl``) run
unchanged under ``raylight run -n N script.py``.

Under `raylight run` an import hook (``raylight.worker.adl.compat``) answers ``import
adaptdl`` and its submodules with this package, where real AdaptDL is not installed
(``RAYLIGHT_ADAPTDL=1``: even where it is). ``adaptdl.torch`` trains on torch's DDP in the
group `raylight run` formed, adapts the batch size with raylight's adaptive engine
(``raylight.adaptive``), and checkpoints its ``State`` objects through the run's agent
channel (``raylight.run_context()``), so that a restarted run resumes. See
docs/adaptdl.md for each call's meaning and what differs.
"""

from raylight.adaptdl import checkpoint, collective, env
from raylight.worker.adl.compat import install_import_hook, uninstall_import_hook

__version__ = "0.2.11"  # the AdaptDL release whose API this follows

__all__ = ["checkpoint", "collective", "env", "install_import_hook", "uninstall_import_hook"]
