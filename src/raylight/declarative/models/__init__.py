"""The built-in declarative model: feature encoders, a concat combiner, one output decoder."""

from raylight.declarative.models.ecd import DeclarativeModel, build_model

__all__ = ["DeclarativeModel", "build_model"]
