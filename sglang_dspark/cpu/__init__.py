"""CPU support for SGLang's DSPARK path (active only when SGLang runs on CPU)."""
