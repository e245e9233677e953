"""What the ``spotd`` commands print: the consoles, rich tables and lines of text.

No command line here (no typer): each function takes the views the commands fetched.
"""
