"""Run on host a by tests/hosts/test_lightning_over_hosts.py: a Lightning Trainer with
RayStrategy (2 workers, which the cluster puts on b and c) fits the digits example for one
epoch with a CSVLogger, a TensorBoardLogger and a ModelCheckpoint under ROOT. Prints, as the
last line (JSON), what the driver's Trainer says afterwards: each logger's version and
log_dir, the checkpoint's best path, the workers' hosts."""

import json
import os
import sys

import lightning.pytorch as pl
import ray.cloudpickle
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from raylight.lightning import RayStrategy

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "examples", "lightning"))
import ddp_digits  # noqa: E402

ray.cloudpickle.register_pickle_by_value(ddp_digits)


root = sys.argv[1]
loggers = [CSVLogger(os.path.join(root, "csv")), TensorBoardLogger(os.path.join(root, "tb"))]
checkpoints = ModelCheckpoint(dirpath=os.path.join(root, "ckpt"))
trainer = pl.Trainer(
    max_epochs=1, limit_train_batches=4, limit_val_batches=2, strategy=RayStrategy(num_workers=2), logger=loggers, callbacks=[checkpoints],
    log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False,
)
trainer.fit(ddp_digits.DigitsClassifier(), datamodule=ddp_digits.DigitsDataModule(batch_size=64))
print(json.dumps({
    "versions": [lg.version for lg in loggers],
    "log_dirs": [lg.log_dir for lg in loggers],
    "best": checkpoints.best_model_path,
    "log_dir": trainer.log_dir,
}))
