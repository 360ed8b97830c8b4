"""Example trainers written against the entrypoint's hooks contract."""
