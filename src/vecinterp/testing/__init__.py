"""Helpers for testing vecinterp models: an independent plain-PyTorch reference."""

from .reference import PlainTransformer

__all__ = ["PlainTransformer"]
