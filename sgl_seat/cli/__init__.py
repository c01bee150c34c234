"""Thin typer commands: parse, call one library function, print."""
