"""``python -m hf_msv.training`` (also what ``accelerate launch -m hf_msv.training`` runs)."""

from .cli import main

if __name__ == "__main__":
    main()
