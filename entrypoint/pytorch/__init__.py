"""The PyTorch path: torch elastic launch, DDP loop, chief-only checkpoints and export."""
