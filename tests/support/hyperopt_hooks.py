"""A `raylight hyperopt` driver that a test SIGKILLs with one trial finished and another
mid-way (tests/declarative/test_declarative_resume.py).

``python -m tests.support.hyperopt_hooks MARKER LEARNING_RATE BLOCK_AFTER ARGS...`` runs
``raylight ARGS`` (the CLI) in this process with hyperopt's trial function replaced by
``_declarative_trial`` below: in the trial whose ``trainer.learning_rate`` is
LEARNING_RATE, rank 0 stops for good right after its report of epoch BLOCK_AFTER
(``declarative_hooks.blocking_loop``, which writes MARKER); every other trial is the
product's own. The trial runs in a Tune actor, not in this process: what it needs travels
in ``BLOCK_ENV``, which this process sets before Ray starts, so the embedded cluster's
processes inherit it.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any

from raylight.declarative import hyperopt
from tests.support import declarative_hooks

BLOCK_ENV = "RAYLIGHT_TEST_HYPEROPT_BLOCK"
_product_trial = hyperopt._declarative_trial  # imported before the patch below


def _declarative_trial(sampled: dict[str, Any], **kwargs: Any) -> None:
    """hyperopt's trial, blocking in the chosen trial. Named as the product's: a restored
    Tune experiment refuses a trainable of another name."""
    import raylight.declarative.train as train

    block = json.loads(os.environ[BLOCK_ENV])
    original = train.declarative_loop
    if sampled.get("trainer.learning_rate") == block["learning_rate"]:
        train.declarative_loop = functools.partial(  # type: ignore[assignment]
            declarative_hooks.blocking_loop, marker=block["marker"], after_epoch=block["after_epoch"]
        )
    try:
        _product_trial(sampled, **kwargs)
    finally:  # the trial's process may serve the next trial (reuse_actors)
        train.declarative_loop = original  # type: ignore[assignment]


if __name__ == "__main__":
    marker, learning_rate, block_after, *args = sys.argv[1:]
    os.environ[BLOCK_ENV] = json.dumps(
        {"marker": marker, "learning_rate": float(learning_rate), "after_epoch": int(block_after)}
    )
    # by its name, not as __main__, so that Ray pickles the trial by reference
    from tests.support import hyperopt_hooks

    hyperopt._declarative_trial = hyperopt_hooks._declarative_trial  # type: ignore[assignment]
    from raylight.cli.main import main

    sys.argv = ["raylight", *args]
    main()
