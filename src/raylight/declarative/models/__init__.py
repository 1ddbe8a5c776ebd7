"""The built-in declarative model: feature encoders, a combiner (Ludwig's types), one decoder per output."""

from raylight.declarative.models.ecd import DeclarativeModel, build_model

__all__ = ["DeclarativeModel", "build_model"]
