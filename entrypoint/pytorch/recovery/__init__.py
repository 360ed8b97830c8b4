"""What keeps the hooks loop's steps safe: stop signals and the per-step vote, non-finite losses, the platform's
advance notice, hangs, and survivors that keep training (``resilience.py`` is the loop's one object for all of it)."""
