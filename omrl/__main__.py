"""``python -m omrl`` runs the command line."""

from omrl.cli import main

main()
