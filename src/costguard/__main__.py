"""``python -m costguard`` runs the command-line interface."""

from costguard.cli import main

if __name__ == "__main__":
    main()
