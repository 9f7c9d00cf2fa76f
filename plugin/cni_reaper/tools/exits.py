"""The command line's exit codes (README, "Exit codes")."""

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_FOUND, EXIT_LEFT, EXIT_DOCTOR, EXIT_BLIND = 0, 1, 2, 3, 4, 5, 6
