"""Launching and supervising ranks: the launcher, the worker each rank runs, the layout of
processes, timeouts, progress, devices, models named on the command line, --verify and --profile."""
