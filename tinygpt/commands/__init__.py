"""The command line: its flags and their checks, and the commands that are not a run
(info, inspect, export) with the tables they print."""
