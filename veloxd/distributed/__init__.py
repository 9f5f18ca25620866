"""Distributed entries: one server sharded over several ranks (Macs) through MLX's launcher.

Stdlib-only modules (the daemon and the config checker import them): `hostfile` (MLX's hostfile
format), `checks` (config rules), `kv_figures` (a group's KV figure), `command` (the group's command line), `rank_lines` (output
tagged by rank). `launcher` is the group process itself; it imports MLX.
"""
