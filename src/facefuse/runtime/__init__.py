"""The model runtime: execution providers, IO binding and warm-up."""
