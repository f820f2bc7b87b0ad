"""``python -m hf_msv.reproduction``: the same as ``hf-msv reproduce``."""

from .pipeline import main

main()
