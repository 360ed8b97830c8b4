"""Who holds the job dir (its lease) and what the job ran with (its record)."""
