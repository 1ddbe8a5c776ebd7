"""Declarative training: a YAML config and a dataset in, a trained model out."""
