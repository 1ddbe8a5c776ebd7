"""What Lightning prints, quiet (raylight's default) or verbose (``raylight.base.verbosity``).

Lightning writes, on the driver when its Trainer is built and on every worker as the entry
point runs: INFO lines through its loggers (``GPU available``, ``TPU available``, a tip to
install litlogger, ```Trainer.fit` stopped``), a model summary (rich's table, printed
straight to the console), ``PossibleUserWarning`` tips (the logging interval, a
``DistributedSampler`` under ``trainer.test``) and the deprecation warnings of the libraries
under it (torch's pytree API, as Lightning calls it). Quiet, none of these are made:
Lightning's loggers are at WARNING, those two kinds of warning are ignored, and a worker's
trainer has no model-summary callback. Lightning's other warnings, its errors and what
``trainer.test`` and ``trainer.validate`` return (their results table) stay. Verbose
(``RAYLIGHT_VERBOSE=1``, ``raylight --verbose``) leaves Lightning as Lightning is.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from raylight.base import verbosity

# Lightning's two package loggers (Lightning adds a console handler to the first at import).
_LOGGERS = ("lightning.pytorch", "lightning.fabric")
# Warnings attributed to Lightning's modules (re.match on the warning's module).
_LIGHTNING_MODULES = r"(lightning|lightning_fabric|pytorch_lightning|lightning_utilities)(\.|$)"


def quiet_lightning() -> bool:
    """In this process (the driver, or a worker): Lightning's INFO lines, tips and
    deprecation warnings off unless verbose. Returns whether they are off."""
    quiet = not verbosity.is_verbose()
    if not quiet:
        return False
    for name in _LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    from lightning.fabric.utilities.rank_zero import LightningDeprecationWarning
    from lightning.fabric.utilities.warnings import PossibleUserWarning

    # Lightning's own two categories, wherever the warning points (its callers' lines) ...
    warnings.filterwarnings("ignore", category=PossibleUserWarning)
    warnings.filterwarnings("ignore", category=LightningDeprecationWarning)
    # ... and the libraries' deprecations that Lightning's own code sets off.
    for category in (DeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category, module=_LIGHTNING_MODULES)
    return True


def quiet_worker(trainer: Any) -> None:
    """On a worker, before the entry point runs: as ``quiet_lightning``, and no model
    summary (rich's prints a table on rank 0; the plain one is an INFO line)."""
    if not quiet_lightning():
        return
    from lightning.pytorch.callbacks import ModelSummary  # RichModelSummary is one too

    trainer.callbacks[:] = [c for c in trainer.callbacks if not isinstance(c, ModelSummary)]
