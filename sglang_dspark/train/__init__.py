"""DSpark drafter training (issue #7): online target capture, the DSpark loss, a draft
whose math equals SGLang 0.5.23's ``Qwen3DSparkModel``, and a reproducible tiny pair.

CLI: ``python -m sglang_dspark.train {draft,tiny-pair,export-dflash} --help``.
"""
