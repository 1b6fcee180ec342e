"""``python -m spectest`` runs the CLI (same as the ``spectest`` console script)."""

from spectest.cli import main

if __name__ == "__main__":
    main()
