"""Notices for people: what each ``[[notify]]`` sink is sent and when (``notices``), and
handing them to command and webhook sinks (``sinks``). Imports the core only."""
