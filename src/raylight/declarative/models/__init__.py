"""The built-in declarative model: feature encoders, a concat combiner, one output decoder."""

from raylight.declarative.models.ecd import DeclarativeModel, build_model, loss_for, predictions

__all__ = ["DeclarativeModel", "build_model", "loss_for", "predictions"]
