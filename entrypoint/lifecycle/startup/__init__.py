"""Start-up waits: every peer met at the barrier, servers listening, the ports a launcher hands out."""
