"""sglang-dspark: serving-side DSpark speculative decoding for SGLang 0.5.23."""

__version__ = "0.1.0"
