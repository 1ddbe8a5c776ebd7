"""DDP on Ray with PyTorch Lightning: the raylight version of ray_lightning's README
example (an MNIST-like classifier; here scikit-learn's bundled 8x8 digits, no download).

Run:  python examples/lightning/ddp_digits.py
      python examples/lightning/ddp_digits.py --num-workers 2 --epochs 5 --address auto
Needs: pip install 'raylight[lightning,examples]'

The ``pl.Trainer`` stays in this process; ``RayStrategy`` runs fit and test on
``num_workers`` Ray actors (an embedded local Ray unless --address is given) and brings
the trained weights, metrics and the best checkpoint's path back here.
"""

from __future__ import annotations

import argparse
import tempfile

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from raylight.lightning import RayStrategy


class DigitsClassifier(pl.LightningModule):
    def __init__(self, hidden: int = 64, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def _loss_acc(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batch
        logits = self(x)
        return nn.functional.cross_entropy(logits, y), (logits.argmax(1) == y).float().mean()

    def training_step(self, batch, batch_idx):
        loss, _ = self._loss_acc(batch)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        loss, acc = self._loss_acc(batch)
        self.log_dict({"val_loss": loss, "val_acc": acc}, sync_dist=True)

    def test_step(self, batch, batch_idx):
        loss, acc = self._loss_acc(batch)
        self.log_dict({"test_loss": loss, "test_acc": acc}, sync_dist=True)

    def predict_step(self, batch, batch_idx):
        return self(batch[0]).argmax(1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class DigitsDataModule(pl.LightningDataModule):
    """Digits split 1,400 train / 397 validation (the test set is the validation set)."""

    def __init__(self, batch_size: int = 32) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        digits = load_digits()
        x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
        y = torch.tensor(digits.target)
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
        x, y = x[order], y[order]
        self.train_set = TensorDataset(x[:1400], y[:1400])
        self.val_set = TensorDataset(x[1400:], y[1400:])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=128)

    def test_dataloader(self):
        return self.val_dataloader()

    def predict_dataloader(self):
        return self.val_dataloader()


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--address", default=None, help="Ray cluster address (default: embedded local Ray)")
    parser.add_argument("--root-dir", default=None, help="logs and checkpoints (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0, help="the model's initial weights (the data order is seeded too)")
    args = parser.parse_args(argv)

    root = args.root_dir or tempfile.mkdtemp(prefix="raylight-lightning-example-")
    torch.manual_seed(args.seed)  # the workers get this model, so its initial weights
    model = DigitsClassifier()
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        strategy=RayStrategy(num_workers=args.num_workers, address=args.address),
        callbacks=[ModelCheckpoint(monitor="val_acc", mode="max")],
        default_root_dir=root,
        enable_progress_bar=False,
    )
    trainer.fit(model, datamodule=DigitsDataModule())
    test = trainer.test(model, datamodule=DigitsDataModule())[0]
    print(f"best checkpoint: {trainer.checkpoint_callback.best_model_path}")
    print(f"test_acc {float(trainer.callback_metrics['test_acc']):.3f} after {trainer.current_epoch} epochs")
    return {"test_acc": test["test_acc"], "epochs": trainer.current_epoch}


if __name__ == "__main__":
    main()
