"""Profiling tools: measure a live server (``live``), the profiles library (``tools``),
pictures (``plots``) and the profile subcommands of ``dspark-controller`` (``cli``)."""
